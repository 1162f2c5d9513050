"""How good a detector is: box matching, VOC and COCO mAP (``metrics``), evaluation of a
detector on a record set or annotation file with its report (``validate``), and the
precision-recall curves and galleries (``plots``)."""
