"""The trainer: minibatches into compiled steps (``trainer``, ``train_step``), what it asks of
the process around it (``hooks``), the background writer of its checkpoints
(``checkpoint_writer``), the model and its devices (``modeling``; several mirrored:
``placement``), input and target scaling
(``scaling``), the update policy with replay and drift (``update_policy``, ``replay``,
``drift``) and prequential scores (``prequential``).

Imports ``ingest`` (the sample queue it drains), ``storage``, ``wire`` (snapshots: what it hands
to serving and the weight stream), ``config``, ``base`` and ``livefit.models``. Never HTTP.
"""
