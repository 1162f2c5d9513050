"""Running a trained detector: ``Detector`` on a Keras model (``detect``), decoding and NMS
(``postprocess``), what a saved detector is (``detector_spec``), export to SavedModel, ONNX
and TFLite (``export``), and one ``load_detector`` for every form (``runtime``)."""
