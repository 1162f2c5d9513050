"""How replicas and workers exchange gradients: the all-reduce and its wire dtype
(``allreduce``), PowerSGD compression (``powersgd``) and local steps with periodic
averaging (``local_steps``; overlapped with the steps: ``overlap``; in 8 or 4 bits:
``quantize``), each one implementation of the
interface the trainer is handed (``schemes``, built from the flags by
``communication_from``); ``reducer`` is where Keras's gradient reduction is replaced."""
