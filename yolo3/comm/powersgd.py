"""PowerSGD: the gradient all-reduce as two thin matrices per convolution, with error feedback.

Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization", NeurIPS 2019. On a slow link the full gradient all-reduce is the
step (YOLOv3's 248 MB of float32 gradient take about 20 s at 100 Mbit/s). PowerSGD sends,
for each large convolution kernel seen as an ``n x m`` matrix (``n`` output channels,
``m = kh * kw * cin``), an ``n x r`` and an ``m x r`` matrix instead: ``(n + m) * r``
numbers in place of ``n * m``.

One power-iteration step per optimizer step, in replica context, with ``R`` replicas and
this replica's gradient ``g`` (Keras hands each replica its local mean gradient divided by
``R``, so that the SUM over replicas is the mean gradient):

- ``M = R * g + E``: the local mean gradient plus this replica's error buffer ``E``;
- ``P = sum_replicas(M Q) / R``, orthonormalised (QR);
- ``Q' = sum_replicas(M^T P) / R``;
- the update uses ``P Q'^T``, a rank-``r`` approximation of the mean over replicas of ``M``;
- ``E <- M - P Q'^T`` (what this step did not send is sent later: error feedback) and
  ``Q <- Q'`` (warm start: the next step refines the same subspace).

So over ``T`` steps the applied updates sum to the mean gradients' sum plus
``mean(E_0) - mean(E_T)``: nothing is lost, only delayed.

State, built under the strategy's scope (:class:`PowerSGDState`): per compressed kernel a
``Q`` identical on every replica (seeded, and only ever assigned all-reduced values) and an
error buffer per replica. Both are ``ON_READ`` variables: each replica assigns its own copy
with no communication. The updates depend on the error buffers only through their mean over
the replicas (``P``, ``Q'`` and the update are linear in it), so a checkpoint saves that
mean (``aggregation=MEAN``) and a restore puts it into every replica. Saving also puts it
into every replica of the running job: that changes nothing but rounding, and from then on
the running job and a job resumed from the file hold the same bits, so the resumed one
continues exactly as the uninterrupted one does.

Only convolution kernels where the factors take at most half the bytes are compressed
(:func:`worth_compressing`); biases, batch-norm parameters and small kernels go through the
ordinary all-reduce (:func:`yolo3.comm.allreduce.all_reduce_gradients`, in
``--allreduce-dtype``). The factors travel in the gradient's own dtype.
"""

import keras
import numpy as np
import tensorflow as tf

from yolo3.comm.allreduce import BYTES_PER_ELEMENT, all_reduce_gradients
from yolo3.comm.reducer import install_reducer
from yolo3.distributed.collectives import all_reduce_by_dtype

COMPRESSIONS = ("none", "powersgd")
FLOAT16_REFUSAL = (
    "--compress powersgd is not supported with float16 mixed precision: loss scaling applies "
    "the update inside a conditional branch (to skip overflowing steps), where its "
    "collectives would run; use --mixed-precision bfloat16 or off"
)


def matrix_shape(shape):
    """``(m, n)``: a kernel ``(kh, kw, cin, cout)`` as ``kh * kw * cin`` rows by ``cout``.

    This is the transpose of the paper's ``n x m`` matrix; kept this way, a kernel becomes
    the matrix with a reshape alone, no transposed copy.
    """
    shape = [int(d) for d in shape]
    return int(np.prod(shape[:-1])), shape[-1]


def worth_compressing(shape, rank):
    """True for a convolution kernel whose rank-``rank`` factors take at most half its size.

    ``2 * (n + m) * r <= n * m`` also implies ``r < min(n, m) / 2``: the approximation is
    genuinely low-rank, and the saving pays for the two extra collectives' latency.
    """
    if len(shape) != 4:
        return False
    m, n = matrix_shape(shape)
    return 2 * (n + m) * rank <= n * m


def compressible(variables, rank):
    """The variables of ``variables`` that :func:`worth_compressing` selects, in order."""
    return [v for v in variables if worth_compressing(tuple(v.shape), rank)]


def powersgd_bytes(variables, rank, dtype="float32"):
    """Bytes one replica's gradient all-reduce carries per step with PowerSGD.

    Compressed kernels send ``(n + m) * rank`` float32 numbers (both factors); every other
    variable its full gradient in ``dtype``. Compare with
    :func:`yolo3.comm.allreduce.allreduce_bytes`.
    """
    total = 0
    for variable in variables:
        shape = tuple(variable.shape)
        if worth_compressing(shape, rank):
            m, n = matrix_shape(shape)
            total += (n + m) * rank * BYTES_PER_ELEMENT["float32"]
        else:
            total += int(np.prod(shape)) * BYTES_PER_ELEMENT[dtype]
    return total


def variable_key(variable):
    """One key per model variable, the same for a Keras variable, its ``tf.Variable``, a
    distributed variable and any of its per-replica components (as Keras's optimizer keys
    its slots)."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    if isinstance(variable, tf.distribute.DistributedValues):
        return variable._unique_id
    if hasattr(variable, "_distributed_container"):
        variable = variable._distributed_container()
    elif hasattr(variable, "handle") and hasattr(variable.handle, "_distributed_container"):
        variable = variable.handle._distributed_container()
    return variable._unique_id


class PowerSGDState(keras.layers.Layer):
    """``Q`` and the error buffers of every compressed kernel; saved with the trainer.

    Build it under the strategy's scope, in the same order on every worker. A Keras layer
    only so that ``trainer.save_weights`` / ``load_weights`` (checkpoints, backups) carry it;
    its ``tf.Variable`` objects are not Keras weights, so they stay out of ``trainer.weights``
    (and of the chief's broadcast on restore, which would replace each worker's buffers).

    Args:
        variables: the kernels to compress (Keras or tf variables of rank 4).
        rank: ``r``; at most ``min(n, m)`` of each kernel.
        seed: ``Q`` of the i-th kernel starts as a standard normal draw seeded by
            ``(seed, i)``, identical on every worker.
    """

    def __init__(self, variables, rank, *, seed=0, name="powersgd"):
        super().__init__(name=name, trainable=False)
        self.rank = int(rank)
        self._index = {}
        self._shapes = []
        q_factors, errors = [], []
        on_read = tf.VariableSynchronization.ON_READ
        for index, variable in enumerate(variables):
            shape = tuple(int(d) for d in variable.shape)
            m, n = matrix_shape(shape)
            if not 1 <= self.rank <= min(m, n):
                raise ValueError(
                    f"--rank {self.rank}: a {shape} kernel ({n} x {m}) allows at most {min(m, n)}"
                )
            dtype = tf.as_dtype(variable.dtype)
            start = tf.random.stateless_normal((m, self.rank), seed=[seed, index], dtype=dtype)
            q_factors.append(
                tf.Variable(
                    start,
                    trainable=False,
                    synchronization=on_read,
                    # Every replica holds the same value: reading takes the first's.
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                    name=f"powersgd_q_{index}",
                )
            )
            errors.append(
                tf.Variable(
                    tf.zeros(shape, dtype),
                    trainable=False,
                    synchronization=on_read,
                    aggregation=tf.VariableAggregation.MEAN,
                    name=f"powersgd_error_{index}",
                )
            )
            self._index[variable_key(variable)] = index
            self._shapes.append(shape)
        # Kept in a tuple: plain tf.Variables that Keras does not collect as weights.
        self._state = (tuple(q_factors), tuple(errors))
        self.built = True

    @property
    def q_factors(self):
        return self._state[0]

    @property
    def errors(self):
        return self._state[1]

    def __len__(self):
        return len(self._shapes)

    def slot(self, variable):
        """The index of ``variable``'s state, or None when it is not compressed."""
        return self._index.get(variable_key(variable))

    def compress(self, grads, slots, options=None):
        """One PowerSGD step for ``grads`` (Keras-scaled: local mean / replicas) of the
        kernels at ``slots``; returns the mean-gradient approximations, same shapes.

        Runs in replica context. Two ``all_reduce`` calls per dtype: the ``P`` factors
        together, then the ``Q`` factors together.
        """
        if not grads:
            return []
        context = tf.distribute.get_replica_context()
        replicas = 1 if context is None else context.num_replicas_in_sync

        def mean_over_replicas(tensors):
            if replicas > 1:
                tensors = all_reduce_by_dtype(context, tensors, options)
            return [t / tf.cast(replicas, t.dtype) for t in tensors]

        matrices, q_old = [], []
        for grad, slot in zip(grads, slots):
            shape = matrix_shape(self._shapes[slot])
            # tf.identity: this replica's own copy, a tensor on its device.
            error = tf.reshape(tf.identity(self.errors[slot]), shape)
            local = tf.reshape(grad, shape) * tf.cast(replicas, grad.dtype)
            matrices.append(local + error)
            q_old.append(tf.identity(self.q_factors[slot]))
        # P = M Q for the paper's M (n x m), with our matrices its transpose (m x n).
        p_factors = mean_over_replicas(
            [tf.matmul(g, q, transpose_a=True) for g, q in zip(matrices, q_old)]
        )
        p_factors = [tf.linalg.qr(p)[0] for p in p_factors]
        q_new = mean_over_replicas([tf.matmul(g, p) for g, p in zip(matrices, p_factors)])
        approximations = []
        for grad, slot, matrix, p, q, old in zip(grads, slots, matrices, p_factors, q_new, q_old):
            approx = tf.matmul(q, p, transpose_b=True)  # (P Q'^T)^T, m x n
            self.errors[slot].assign(tf.reshape(matrix - approx, self._shapes[slot]))
            # A zero gradient gives Q' = 0, from which no later step could recover.
            self.q_factors[slot].assign(tf.where(tf.reduce_any(q != 0), q, old))
            approximations.append(tf.reshape(approx, tf.shape(grad)))
        return approximations

    # -- checkpoints -------------------------------------------------------------------

    def save_own_variables(self, store):
        """``Q`` (the first replica's: all are equal) and the MEAN over all replicas of each
        error buffer, which then replaces every replica's buffer: the job goes on from
        exactly what the file holds, as a job resumed from it will.

        Reading the mean all-reduces across workers: every worker saves at the same points
        (see ``yolo3.distributed.strategy.chief_only_path``), and every worker receives the same
        mean.
        """
        for index, (q, error) in enumerate(zip(self.q_factors, self.errors)):
            store[f"q_{index}"] = np.asarray(q.read_value())
            mean = error.read_value()
            error.assign(mean)
            store[f"error_{index}"] = np.asarray(mean)

    def load_own_variables(self, store):
        """Restores ``Q`` and puts the saved mean error buffer into every replica.

        Strict: a file without the state, or with another rank's, is refused. (Keras reaches
        this layer by two paths, its attribute and the trainer's ``layers``, and forgets a
        failed load when a later one succeeds: accepting an empty store would hide a
        mismatch.)
        """
        keys = set(store.keys())
        expected = {f"{kind}_{i}" for i in range(len(self)) for kind in ("q", "error")}
        if keys != expected:
            raise ValueError(
                f"the checkpoint holds PowerSGD state for {len(keys) // 2} kernels, this run "
                f"compresses {len(self)}: resume with the --compress and --rank it was saved with"
            )
        for index, (q, error) in enumerate(zip(self.q_factors, self.errors)):
            for variable, value in ((q, store[f"q_{index}"]), (error, store[f"error_{index}"])):
                value = np.asarray(value)
                if tuple(value.shape) != tuple(variable.shape):
                    raise ValueError(
                        f"PowerSGD state {variable.name}: saved {value.shape}, expected "
                        f"{tuple(variable.shape)}; resume with the --rank it was saved with"
                    )
                variable.assign(value.astype(variable.dtype.as_numpy_dtype))


def powersgd_all_reduce(state, grads_and_vars, dtype="float32", options=None):
    """Keras's ``_all_reduce_sum_gradients`` with PowerSGD for the kernels in ``state``.

    ``grads_and_vars`` as Keras passes them (None gradients stay None); the others are
    summed by :func:`yolo3.comm.allreduce.all_reduce_gradients` in ``dtype``.
    """
    pairs = list(grads_and_vars)
    result = [(None, var) for _, var in pairs]
    plain, compressed, slots = [], [], []
    for index, (grad, var) in enumerate(pairs):
        if grad is None:
            continue
        slot = state.slot(var)
        if slot is None:
            plain.append(index)
        else:
            compressed.append(index)
            slots.append(slot)
    summed = all_reduce_gradients([pairs[i][0] for i in plain], dtype, options)
    approximations = state.compress([pairs[i][0] for i in compressed], slots, options)
    for index, total in zip(plain + compressed, summed + approximations):
        result[index] = (total, pairs[index][1])
    return result


def install_powersgd_reducer(optimizer, state, dtype="float32", options=None):
    """Makes ``optimizer`` (a Keras 3 TensorFlow optimizer) reduce gradients with
    :func:`powersgd_all_reduce`, as :func:`yolo3.comm.allreduce.install_gradient_reducer`
    does for the plain all-reduce.

    Refuses a loss-scale optimizer: its TensorFlow path applies the update inside a
    ``cond`` on whether the gradients are finite, so the collectives would run in a branch.
    """
    return install_reducer(
        optimizer,
        lambda pairs: powersgd_all_reduce(state, pairs, dtype, options),
        loss_scale_refusal=FLOAT16_REFUSAL,
    )
