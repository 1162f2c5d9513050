"""Where training runs: devices and logical CPU replicas (``devices``), the
``tf.distribute`` strategy for one or several GPUs and machines, TF_CONFIG and Slurm
(``strategy``), the Keras multi-worker workaround (``keras_mwms``), the allocator setting
the strategies' input iterator changes (``malloc``) and free ports for local workers
(``ports``)."""
