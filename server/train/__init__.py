"""The trainer: minibatches into compiled steps (``trainer``, ``train_step``), what it asks of
the process around it (``hooks``), its checkpoints and versions (``checkpointing``,
``checkpoint_writer``), the model and its device (``modeling``), input and target scaling
(``scaling``), the update policy with replay and drift (``update_policy``, ``replay``,
``drift``) and prequential scores (``prequential``).

Imports: ``ingestion.samples`` (the queue it drains), ``storage``, ``snapshot`` (what it hands
to serving and the weight stream), ``latest_worker``, ``config``, ``metrics``. Never HTTP.
"""
