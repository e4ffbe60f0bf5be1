"""The trainer: minibatches into compiled steps (``trainer``, ``train_step``; the next step
started before the previous batch is finished: ``step_pipeline``), what a learned batch did,
counted (``accounting``), the weights handed downstream (``snapshots``), the versions claimed on
disk (``version_mark``), its checkpoints (``checkpointing``, written in the background by
``checkpoint_writer``), what it asks of the process around it (``hooks``), the model and its
devices (``modeling``; several mirrored: ``placement``), input and target scaling
(``scaling``), the update policy with replay and drift (``update_policy``, ``replay``,
``drift``) and prequential scores (``prequential``).

Imports ``ingest`` (the sample queue it drains), ``storage``, ``wire`` (snapshots: what it hands
to serving and the weight stream), ``config``, ``base`` and ``livefit.models``. Never HTTP.
"""
