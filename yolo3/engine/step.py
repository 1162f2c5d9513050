"""How a trainer's compiled train function is assembled, and the step with micro-batches.

:class:`StepFunctions` is the part of :class:`yolo3.engine.trainer.YoloTrainer` that makes
Keras's train function into the one a run needs, each piece a wrapper around the compiled
step: the input wait (:meth:`~StepFunctions.measure_input_wait`), stop requests
agreed by every worker (:meth:`~StepFunctions.attach_stop_flag`), one compiled step per
input size with multi-scale training, the communication's own wrapper (the dense warm-up's
switch) and glibc's malloc thresholds (:mod:`yolo3.distributed.malloc`).
:func:`accumulated_step` is the train step with ``accumulate`` micro-batches.

The class expects the trainer's ``accumulate``, ``multi_scale``, ``communication``,
``status``, ``weight_average``, ``scale_history`` and ``scale_functions`` attributes.
"""

import tensorflow as tf

from yolo3.data.multiscale import resize_batch
from yolo3.distributed import malloc

# A train-step log: seconds between the step's request and its batch's arrival.
INPUT_WAIT_KEY = "input_wait"
# A train-step log, removed before callbacks see it: > 0 when any worker asked to stop.
STOP_KEY = "stop_requested"


class StepFunctions:
    """The train and test functions of a ``keras.Model`` trainer (a mixin, before
    ``keras.Model`` in the bases)."""

    _input_wait = False
    _stop_flag = None

    def measure_input_wait(self):
        """Each step logs ``INPUT_WAIT_KEY``: the seconds from just before it asked the
        iterator for its batch to the batch's arrival.

        Both ends are stamped in the graph: from the host's request time, the wait would
        also count the call's dispatch (about 15 ms a step under MultiWorkerMirroredStrategy)
        and the tracing of each new multi-scale size.
        """
        self._input_wait = True
        self.train_function = None

    def attach_stop_flag(self, flag):
        """Lets a worker ask the whole job to stop after the current step.

        ``flag`` (float32 tf.Variable) is this worker's request (0 or 1); each step reduces
        it over every replica of every worker along with the step's logs, which cost no
        collective of its own, and sets ``status.stop_requested`` on every worker alike, so that
        all of them stop after the same step.
        """
        self._stop_flag = flag
        self.train_function = None

    def make_train_function(self, force=False):
        if self.train_function is not None and not force:
            return self.train_function
        function = self._make_train_function(force)
        if self._stop_flag is not None:
            function = self._with_stop_requests(function)
        function = self.communication.wrap_train_function(function, self)
        function = self._with_weight_average(function)
        function = self._with_malloc_thresholds(function)
        self.train_function = function
        return function

    def make_test_function(self, force=False):
        if self.test_function is not None and not force:
            return self.test_function
        super().make_test_function(force=force)  # sets self.test_function
        self.test_function = self._with_malloc_thresholds(self.test_function)
        return self.test_function

    def _with_malloc_thresholds(self, function):
        """``function``, restoring glibc's malloc thresholds before each step where the
        strategy's input iterators pin them (:mod:`yolo3.distributed.malloc`)."""
        strategy = self.distribute_strategy
        if not isinstance(
            strategy, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
        ):
            return function

        def step_function(iterator):
            malloc.restore_thresholds()
            return function(iterator)

        return step_function

    def _with_weight_average(self, function):
        """``function``, then one update of the weights' moving average (if kept)."""
        average = self.weight_average
        if average is None:
            return function
        strategy = self.distribute_strategy

        def train_function(iterator):
            logs = function(iterator)
            average.update(strategy)
            return logs

        return train_function

    def _with_stop_requests(self, function):
        def train_function(iterator):
            logs = dict(function(iterator))
            self.status.stop_requested = bool(logs.pop(STOP_KEY) > 0)
            return logs

        return train_function

    def _make_train_function(self, force):
        """Keras's train function, with the batch's arrival stamped outside the step.

        XLA has no kernel for ``tf.timestamp``, so the clock is read in an outer function
        that takes the batch from the iterator and then calls the replicated step, which
        Keras's own way compiles (with XLA when ``jit_compile`` is on). With ``multi_scale``
        each size gets such a function of its own, with static shapes, and a Python
        dispatcher calls the one for the step's size.
        """
        timed = self._input_wait
        own_step = self.multi_scale is not None or self.accumulate > 1
        own_step = own_step or self._stop_flag is not None
        if not own_step and (not timed or self.run_eagerly or self.steps_per_execution != 1):
            super().make_train_function(force=force)  # sets self.train_function
            return self.train_function
        if own_step and (self.run_eagerly or self.steps_per_execution != 1):
            raise ValueError(
                "multi-scale training, gradient accumulation and stop requests run one "
                "compiled step per call"
            )
        if self.multi_scale is None:
            self.train_function = self._sized_train_function(None, timed)
            return self.train_function
        functions = self.scale_functions = {}

        def train_function(iterator):
            # The optimizer's step counter is the same on every replica and worker.
            size = self.multi_scale.size_at(int(self.optimizer.iterations.numpy()))
            if size not in functions:
                functions[size] = self._sized_train_function(size, timed)
            self.scale_history.append(size)
            return functions[size](iterator)

        self.train_function = train_function
        return train_function

    def _sized_train_function(self, size, timed):
        """The compiled step for one input ``size`` (None: the batch as it comes), logging
        its input wait when ``timed``."""
        # The module's reduce_per_replica, looked up per trace: yolo3.distributed.keras_mwms
        # replaces it.
        from keras.src.backend.tensorflow import trainer as tf_trainer

        strategy = self.distribute_strategy

        def sized_step(data, stop):
            if size is not None:
                batches = data if self.accumulate > 1 else (data,)
                batches = tuple(resize_batch(images, boxes, size) for images, boxes in batches)
                data = batches if self.accumulate > 1 else batches[0]
            logs = self.train_step(data)
            if stop is not None:  # reduced with the logs: > 0 when any worker asked
                logs = {**logs, STOP_KEY: stop}
            return logs

        def replicated_step(data, stop):
            outputs = strategy.run(sized_step, args=(data, stop))
            return tf_trainer.reduce_per_replica(outputs, strategy, reduction="auto")

        # No autograph (here and in the outer function): the step is TensorFlow and Keras
        # ops, with no Python branch or loop on a tensor, and autograph's conversion and its
        # wrapping of every call while tracing cost each start about 0.5 s (a two-step run
        # on one core: 6.9 s of training against 6.4 s without).
        step = tf.function(
            replicated_step, reduce_retracing=True, jit_compile=self.jit_compile, autograph=False
        )
        flag = self._stop_flag

        def next_batch(iterator):
            if self.accumulate > 1:
                return tuple(iterator.get_next() for _ in range(self.accumulate))
            return iterator.get_next()

        @tf.function(reduce_retracing=True, autograph=False)
        def train_function(iterator):
            # Read here, outside the compiled step: the flag is a host variable.
            stop = None if flag is None else tf.identity(flag)
            if not timed:
                return step(next_batch(iterator), stop)
            requested = tf.timestamp()
            with tf.control_dependencies([requested]):
                data = next_batch(iterator)
            with tf.control_dependencies(tf.nest.flatten(data, expand_composites=True)):
                arrived = tf.timestamp()
            # Nothing of the step may start before the arrival time is taken.
            logs = dict(step(_after(arrived, data), stop))
            logs[INPUT_WAIT_KEY] = tf.cast(arrived - requested, tf.float32)
            return logs

        return train_function


def _after(stamp, data):
    """``data`` (a nest, composites included) through identities that wait for ``stamp``.

    The step waits for the arrival stamp through its inputs, not through a control
    dependency of its call: where the step captures values at call time (the instance keys
    of MultiWorkerMirroredStrategy's collectives), the placeholders made for them take the
    dependency instead of the call and drop it. The step would start at once, and with one
    inter-op thread the stamp would wait until the step's first collective freed the thread:
    the forward and backward pass would count as input wait.
    """

    def gated(tensor):
        with tf.device(tensor.device), tf.control_dependencies([stamp]):
            return tf.identity(tensor)

    return tf.nest.map_structure(gated, data, expand_composites=True)


def _add(a, b):
    return b if a is None else a if b is None else a + b


def accumulated_step(trainer, data):
    """One optimizer step of ``trainer`` on the micro-batches ``data`` (a tuple of
    ``(x, y)``): each runs forward and backward in turn, their gradients are summed on the
    replica, and the sum is applied (and all-reduced) once. Returns the step's metrics.
    """
    from keras.src.losses import loss as loss_module

    weights = trainer.trainable_weights
    total = None
    for x, y in data:
        if total is not None:
            # One micro-batch at a time: its forward pass waits for the previous
            # gradients, so only one micro-batch's activations are alive at once.
            with tf.control_dependencies(total):
                x = tf.identity(x)
        with tf.GradientTape() as tape:
            y_pred = trainer(x, training=True)
            loss = trainer._compute_loss(x=x, y=y, y_pred=y_pred, training=True)
            # The loss of one micro-batch is 1/accumulate of its share: log the share.
            trainer._loss_tracker.update_state(
                loss_module.unscale_loss_for_distribution(loss) * trainer.accumulate,
                sample_weight=tf.shape(x)[0],
            )
            loss = trainer.optimizer.scale_loss(loss)
        grads = tape.gradient(loss, weights)
        total = grads if total is None else [_add(a, b) for a, b in zip(total, grads)]
    trainer.optimizer.apply_gradients(zip(total, weights))
    return trainer.compute_metrics(x, y, y_pred)
