"""How replicas and workers exchange gradients: the all-reduce and its wire dtype
(``allreduce``), PowerSGD compression (``powersgd``) and local steps with periodic,
optionally overlapped, averaging (``local_steps``)."""
