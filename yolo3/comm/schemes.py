"""How gradients cross the network, as one object the trainer is handed.

:class:`yolo3.engine.trainer.YoloTrainer` takes a :class:`Communication` and calls it at
fixed points, knowing nothing of what it does; each algorithm is one implementation:
:class:`AllReduce` (Keras's all-reduce, optionally in another dtype), :class:`PowerSGD`,
:class:`LocalSteps` and :class:`DenseWarmup` (the whole gradient for a number of steps,
then another scheme). :func:`communication_from` builds one from the values of
``yolo3 train``'s flags, and is where every refusal of those flags, alone or together, is
decided: the classes themselves take their arguments as given.

The interface, in the order a run calls it:

- ``build(body, status)``: in the trainer's ``compile``, under the strategy's scope, after
  the body's weights hold their starting values. Makes ``state`` from the body's weights;
  ``status`` is the trainer's :class:`yolo3.engine.status.TrainingStatus`.
- ``state``: a Keras layer saved with the trainer's weights (the trainer tracks it), or
  None.
- ``install(optimizer)``: gives the compiled optimizer the scheme's gradient reduction,
  through the ``install_*_reducer`` functions of :mod:`yolo3.comm`.
- ``wrap_train_function(function, trainer)``: each time the trainer makes its train
  function; returns the function to call instead (by default ``function`` itself).
- ``in_step()``: at the start of every train step, in replica context, while it is traced.
- ``callbacks(backup=None, *, epoch_ends=True, log=None)``: the callbacks the scheme
  needs in ``fit``, first in the list (after ``compile``); ``log``: where they may advise.
- ``bytes_per_step(body)``, ``describe(body)``, ``all_reduces_in_step``, ``dtype``: what a
  run logs and decides from it (the sync-BN default).
- ``shared_variables(trainer)``: the trainer's variables that every worker holds alike,
  which a restore from backups sets to the chief's.

An object holds the state it built for one trainer: make one per trainer.
"""

import dataclasses

import tensorflow as tf

from yolo3.comm.allreduce import (
    FLOAT_DTYPES,
    allreduce_bytes,
    check_allreduce_dtype,
    install_gradient_reducer,
)
from yolo3.comm.local_steps import (
    DEFAULT_MERGE,
    MERGES,
    LocalStepsState,
    install_local_reducer,
    optimizer_slots,
    sync_bytes,
)
from yolo3.comm.local_sync import LocalSync
from yolo3.comm.powersgd import (
    COMPRESSIONS,
    FLOAT16_REFUSAL,
    PowerSGDState,
    compressible,
    install_powersgd_reducer,
    powersgd_bytes,
)

# The precisions (flag values or Keras policy names) under which PowerSGD is refused.
FLOAT16_PRECISIONS = ("float16", "mixed_float16")


class Communication:
    """The interface (see the module's docstring); the defaults do nothing.

    Attributes:
        dtype: the dtype gradients or weight changes travel in.
        state: the layer ``build`` made (saved with the trainer), or None.
        all_reduces_in_step: False when the train step holds no collective of its own (so
            synchronised batch norm would add one): the sync-BN default is off then.
    """

    dtype = "float32"
    state = None
    status = None
    all_reduces_in_step = True

    def build(self, body, status):
        """Makes ``state`` from ``body``'s weights (once; a second compile keeps it)."""
        self.status = status

    def install(self, optimizer):
        """Gives ``optimizer`` this scheme's gradient reduction."""

    def take_over(self, strategy):
        """This scheme starts in the middle of a run, after another, with every replica
        holding the same weights (:class:`DenseWarmup`)."""

    def in_step(self):
        """Work of each train step besides the gradients' reduction (replica context)."""

    def wrap_train_function(self, function, trainer):
        """The train function the trainer calls in place of ``function``."""
        del trainer
        return function

    def callbacks(self, backup=None, *, epoch_ends=True, log=None):
        """The callbacks of ``fit`` that the scheme needs, before every other one.

        Args:
            backup: the run's :class:`yolo3.callbacks.WorkerBackup` (its saving steps), or
                None.
            epoch_ends: False where epochs are only timing windows (a benchmark).
            log: a print-like function for advice on the scheme's flags, or None.
        """
        del backup, epoch_ends, log
        return []

    def shared_variables(self, trainer):
        """The variables every worker holds alike: the trainer's and its optimizer's."""
        return list(trainer.variables) + list(trainer.optimizer.variables)

    def default_sync_bn(self, replicas):
        """Synchronised batch norm when no flag says: on with more than one replica, unless
        the step holds no collective of its own (``all_reduces_in_step``)."""
        return replicas > 1 and self.all_reduces_in_step

    def bytes_per_step(self, body):
        """Bytes one replica sends per optimizer step for ``body`` (on average)."""
        raise NotImplementedError

    def describe(self, body):
        """One line for the run's log: what crosses the network, and how many bytes."""
        raise NotImplementedError


class AllReduce(Communication):
    """Every step sums the whole gradient over the replicas, sent as ``dtype``: float32,
    bfloat16 or float16 (:func:`yolo3.comm.allreduce.all_reduce_gradients`)."""

    def __init__(self, dtype="float32"):
        self.dtype = dtype

    def install(self, optimizer):
        if self.dtype != "float32":  # float32 is Keras's own all-reduce: left in place
            install_gradient_reducer(optimizer, self.dtype)

    def bytes_per_step(self, body):
        return allreduce_bytes(body.trainable_weights, self.dtype)

    def describe(self, body):
        return self.dtype


class PowerSGD(Communication):
    """The large convolution kernels' gradients all-reduced as rank-``rank`` factors with
    error feedback (:mod:`yolo3.comm.powersgd`); the other gradients in ``dtype``.

    Once per optimizer step: with ``accumulate`` the summed micro-batches are compressed
    together. ``state`` is a :class:`yolo3.comm.powersgd.PowerSGDState`.
    """

    def __init__(self, rank, dtype="float32"):
        self.rank = int(rank)
        self.dtype = dtype

    def build(self, body, status):
        super().build(body, status)
        if self.state is None:
            # Every kernel, frozen ones too: a frozen stage's kernels train later.
            self.state = PowerSGDState(compressible(body.weights, self.rank), self.rank)

    def install(self, optimizer):
        install_powersgd_reducer(optimizer, self.state, self.dtype)

    def bytes_per_step(self, body):
        return powersgd_bytes(body.trainable_weights, self.rank, self.dtype)

    def describe(self, body):
        sent = self.bytes_per_step(body)
        full = allreduce_bytes(body.trainable_weights, self.dtype)
        return (
            f"{self.dtype} + PowerSGD rank {self.rank} ({sent / 1e6:.2f} MB per step "
            f"per worker, {full / 1e6:.2f} MB uncompressed)"
        )


class LocalSteps(Communication):
    """No all-reduce in the step: each replica applies its own gradient, and every
    ``steps`` optimizer steps the replicas average their weight changes, sent as ``dtype``
    (:mod:`yolo3.comm.local_steps`), through :class:`yolo3.comm.local_sync.LocalSync`.

    Args:
        steps: ``H``, optimizer steps between synchronisations.
        outer_lr, outer_momentum: the outer step of each synchronisation (1 and 0: plain
            averaging; DiLoCo's Nesterov momentum otherwise).
        overlap: None, or ``T`` (True: ``H``): each period's weight changes travel during
            the first ``T`` steps of the next period, a chunk in each train step beside its
            computation, and are applied there, ``T`` steps late.
        merge: with ``overlap``: ``"own"`` or ``"eager"``
            (:class:`yolo3.comm.local_steps.LocalStepsState`).
        dtype: the dtype the weight changes travel in (int8 and int4: quantized, see
            :mod:`yolo3.comm.quantize`).
        replicas: the replicas in sync, which the bytes of int8 and int4 depend on; None:
            the strategy in scope's when the bytes are asked for (train.py asks under the
            run's strategy).
        seed: the run's ``--seed``: int8 and int4 round with it (and the replica and the
            step count; :mod:`yolo3.comm.local_steps`).

    ``state`` is a :class:`yolo3.comm.local_steps.LocalStepsState`, built from the body's
    weights as they are at ``compile``.
    """

    all_reduces_in_step = False

    def __init__(
        self, steps, outer_lr=1.0, outer_momentum=0.0, overlap=None, dtype="float32",
        replicas=None, merge=DEFAULT_MERGE, seed=0,
    ):  # fmt: skip
        self.steps = int(steps)
        self.outer_lr = float(outer_lr)
        self.outer_momentum = float(outer_momentum)
        self.overlap = self.steps if overlap is True else int(overlap) if overlap else None
        self.dtype = dtype
        self.replicas = replicas
        self.merge = merge
        self.seed = int(seed)

    def build(self, body, status):
        super().build(body, status)
        if self.state is None:
            self.state = LocalStepsState(
                body.weights,
                self.steps,
                outer_lr=self.outer_lr,
                outer_momentum=self.outer_momentum,
                allreduce_dtype=self.dtype,
                overlap=self.overlap or False,
                merge=self.merge,
                seed=self.seed,
            )

    def install(self, optimizer):
        install_local_reducer(optimizer)

    def take_over(self, strategy):
        self.state.reset(strategy)  # the anchors start from the replicas' common weights

    def in_step(self):
        if self.state.overlap:  # a chunk of the previous period's change; nothing waits on it
            self.state.exchange()

    def callbacks(self, backup=None, *, epoch_ends=True, log=None):

        return [LocalSync(self.state, backup, epoch_ends=epoch_ends, status=self.status, log=log)]

    def shared_variables(self, trainer):
        """All but the inner optimizer's slots, which stay each worker's own
        (:mod:`yolo3.comm.local_steps`)."""
        slots = {id(v) for v in optimizer_slots(trainer.optimizer.variables)}
        shared = [v for v in trainer.optimizer.variables if id(v) not in slots]
        return list(trainer.variables) + shared

    def bytes_per_step(self, body):
        return sync_bytes(body.weights, self.dtype, self.replicas) / self.steps

    def describe(self, body):
        sent = sync_bytes(body.weights, self.dtype, self.replicas)
        per_worker = "MB per worker"
        if self.dtype not in FLOAT_DTYPES:  # the lanes widen with the replicas
            replicas = self.replicas or tf.distribute.get_strategy().num_replicas_in_sync
            per_worker += f" with {replicas} replicas, stochastic rounding"
        outer = "averaging"
        if self.outer_lr != 1.0 or self.outer_momentum:
            outer = f"outer lr {self.outer_lr:g}, Nesterov momentum {self.outer_momentum:g}"
        when = f"every {self.steps} steps"
        if self.overlap:
            when += f", sent during the next {self.overlap} step{'s' if self.overlap > 1 else ''}"
            if self.merge == "eager":
                when += " (eager)"
        return (
            f"none in the step; weight changes {when} in "
            f"{self.dtype} ({sent / 1e6:.2f} {per_worker}; {outer})"
        )


class DenseWarmup(Communication):
    """The first ``steps`` optimizer steps all-reduce the whole gradient (in ``then``'s
    dtype, float32 where that is int8 or int4) as ordinary training does; from then on
    ``then`` (PowerSGD or local steps), in a rebuilt train function. PowerSGD's authors
    start compression after such a warm-up.

    Decided by the optimizer's step counter, so a resumed run switches at the same step.
    While it lasts, ``status.dense_phase`` is True (:class:`yolo3.comm.local_sync.LocalSync`
    does not synchronise then). ``state`` is ``then``'s, built at ``compile``.
    """

    def __init__(self, steps, then):
        self.steps = int(steps)
        self.then = then
        self.dtype = then.dtype
        # int8 and int4 quantize local steps' weight changes: the gradient goes in float32.
        self.gradient_dtype = then.dtype if then.dtype in FLOAT_DTYPES else "float32"

    @property
    def state(self):
        return self.then.state

    @property
    def all_reduces_in_step(self):
        return self.then.all_reduces_in_step

    def build(self, body, status):
        super().build(body, status)
        self.then.build(body, status)
        status.dense_phase = self.steps > 0

    def install(self, optimizer):
        if self.status.dense_phase:
            install_gradient_reducer(optimizer, self.gradient_dtype)
        else:
            self.then.install(optimizer)

    def in_step(self):
        if not self.status.dense_phase:
            self.then.in_step()

    def wrap_train_function(self, function, trainer):
        if not self.status.dense_phase:
            return self.then.wrap_train_function(function, trainer)

        def train_function(iterator):
            # The optimizer's step counter is the same on every replica and worker.
            if int(trainer.optimizer.iterations.numpy()) >= self.steps:
                self._end(trainer)
                return trainer.train_function(iterator)
            return function(iterator)

        return train_function

    def _end(self, trainer):
        """From the next step on: ``then``, in a new train function.

        The replicas hold identical weights here (every step so far was all-reduced), so
        local steps' anchors start from them.
        """
        self.status.dense_phase = False
        self.then.install(trainer.optimizer)
        self.then.take_over(trainer.distribute_strategy)
        trainer.make_train_function(force=True)

    def callbacks(self, backup=None, *, epoch_ends=True, log=None):
        return self.then.callbacks(backup, epoch_ends=epoch_ends, log=log)

    def shared_variables(self, trainer):
        return self.then.shared_variables(trainer)

    def bytes_per_step(self, body):
        """``then``'s: the bytes once the warm-up is over."""
        return self.then.bytes_per_step(body)

    def describe(self, body):
        then = self.then.describe(body)
        gradient = "" if self.gradient_dtype == self.dtype else f" in {self.gradient_dtype}"
        return f"the whole gradient{gradient} for the first {self.steps} steps, then {then}"


@dataclasses.dataclass(frozen=True)
class CommunicationFlags:
    """The values of ``yolo3 train``'s communication flags, as :func:`communication_from`
    takes them (see there); every scheme's chooser and builder reads them."""

    allreduce_dtype: str = "float32"
    compress: str = "none"
    rank: int = 4
    local_steps: int | None = None
    outer_lr: float = 1.0
    outer_momentum: float = 0.0
    overlap_sync: object = None
    dense_steps: int = 0
    overlap_merge: str | None = None
    sync_bn: bool | None = None
    precision: str | None = None
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class SchemeEntry:
    """One communication scheme of :data:`SCHEMES`: ``chooses(flags)`` says whether the
    flags ask for it, ``build(flags)`` makes it."""

    name: str
    chooses: object
    build: object


# The schemes a run can choose, first match wins; a new scheme is a module with its
# Communication and one entry here (its flag a field of CommunicationFlags and TrainConfig).
SCHEMES = (
    SchemeEntry(
        "local-steps",
        lambda flags: flags.local_steps is not None,
        lambda flags: LocalSteps(
            flags.local_steps,
            flags.outer_lr,
            flags.outer_momentum,
            flags.overlap_sync,
            flags.allreduce_dtype,
            merge=flags.overlap_merge or DEFAULT_MERGE,
            seed=flags.seed,
        ),
    ),
    SchemeEntry(
        "powersgd",
        lambda flags: flags.compress == "powersgd",
        lambda flags: PowerSGD(flags.rank, flags.allreduce_dtype),
    ),
    SchemeEntry("allreduce", lambda flags: True, lambda flags: AllReduce(flags.allreduce_dtype)),
)


def communication_from(**flags):
    """The :class:`Communication` of ``yolo3 train``'s flags of the same names (keywords of
    :class:`CommunicationFlags`; the others at their defaults).

    Args:
        allreduce_dtype: ``--allreduce-dtype``: float32, bfloat16 or float16; int8 or int4
            with ``local_steps`` only.
        compress, rank: ``--compress`` (none or powersgd) and ``--rank``.
        local_steps, outer_lr, outer_momentum: ``--local-steps`` (None: off) and its outer
            step.
        overlap_sync: ``--overlap-sync``: None (or False), ``T``, or True (``H``).
        overlap_merge: ``--overlap-merge``: ``own`` or ``eager`` with ``overlap_sync``; None:
            :data:`yolo3.comm.local_steps.DEFAULT_MERGE`.
        dense_steps: ``--dense-steps``: optimizer steps of the whole gradient first.
        sync_bn: ``--sync-bn``: True (on) is refused with local steps; None and False pass.
        precision: the mixed precision in force, as the flag (``float16``) or the Keras
            policy (``mixed_float16``) names it; float16 is refused with PowerSGD. None: not
            known yet.
        seed: ``--seed``, which the stochastic rounding of int8 and int4 draws from.

    The scheme is the first of :data:`SCHEMES` that the flags choose, wrapped in
    :class:`DenseWarmup` with ``dense_steps``.

    Raises:
        ValueError: naming the flags, when a value is unusable or two do not go together.
    """
    flags = CommunicationFlags(**flags)
    check_flags(flags)
    scheme = next(entry for entry in SCHEMES if entry.chooses(flags)).build(flags)
    return DenseWarmup(flags.dense_steps, scheme) if flags.dense_steps else scheme


def check_flags(flags):
    """Refuses, naming the flags, a value of :class:`CommunicationFlags` that is unusable
    or two that do not go together."""
    local_steps, compress = flags.local_steps, flags.compress
    check_allreduce_dtype(flags.allreduce_dtype, local_steps=local_steps is not None)
    _check_compression(compress, flags.rank)
    _check_local_steps(local_steps, flags.outer_lr, flags.outer_momentum, flags.overlap_sync)
    if flags.overlap_merge is not None:
        if flags.overlap_merge not in MERGES:
            raise ValueError(f"--overlap-merge {flags.overlap_merge!r}: use one of {MERGES}")
        if flags.overlap_sync is None or flags.overlap_sync is False:
            raise ValueError(
                "--overlap-merge says where replicas go on from while --overlap-sync sends "
                "their changes: pass --local-steps H --overlap-sync T too"
            )
    if local_steps is not None and compress != "none":
        raise ValueError(
            "--local-steps and --compress powersgd are two answers to one problem: the "
            "synchronisation of --local-steps sends whole weights; pick one"
        )
    if local_steps is not None and flags.sync_bn:
        raise ValueError(
            "--sync-bn on all-reduces in every step, which --local-steps exists to avoid: "
            "use --sync-bn off (each synchronisation averages the batch-norm statistics)"
        )
    if compress == "powersgd" and flags.precision in FLOAT16_PRECISIONS:
        raise ValueError(FLOAT16_REFUSAL)
    dense_steps = flags.dense_steps
    if int(dense_steps) != dense_steps or dense_steps < 0:
        raise ValueError(f"--dense-steps {dense_steps}: use a whole number of optimizer steps >= 0")
    if dense_steps and compress == "none" and local_steps is None:
        raise ValueError(
            "--dense-steps sets how many optimizer steps run uncompressed before "
            "--compress powersgd or --local-steps takes over: pass one of them too"
        )


def _check_compression(compress, rank):
    if compress not in COMPRESSIONS:
        raise ValueError(f"--compress {compress!r}: use one of {COMPRESSIONS}")
    if int(rank) != rank or rank < 1:
        raise ValueError(f"--rank {rank}: use a whole number >= 1")


def _check_local_steps(local_steps, outer_lr, outer_momentum, overlap):
    if not outer_lr > 0:
        raise ValueError(f"--outer-lr {outer_lr}: use a number > 0 (1 with plain averaging)")
    if not 0 <= outer_momentum < 1:
        raise ValueError(f"--outer-momentum {outer_momentum}: use a number in [0, 1)")
    overlapped = overlap is not None and overlap is not False
    if local_steps is None:
        if outer_lr != 1.0 or outer_momentum != 0.0:
            raise ValueError(
                "--outer-lr and --outer-momentum set the outer step of --local-steps: pass "
                "--local-steps H too"
            )
        if overlapped:
            raise ValueError(
                "--overlap-sync sends the weight changes of --local-steps during the steps: "
                "pass --local-steps H too"
            )
        return
    if int(local_steps) != local_steps or local_steps < 1:
        raise ValueError(
            f"--local-steps {local_steps}: use a whole number of optimizer steps >= 1 "
            "between synchronisations"
        )
    steps = local_steps if overlap is True else overlap
    if overlapped and (int(steps) != steps or not 1 <= steps <= local_steps):
        raise ValueError(
            f"--overlap-sync {overlap}: use a number of steps from 1 to --local-steps "
            f"({local_steps})"
        )
