"""Settings: the TOML/env configuration validated whole at start (``settings``: ``Settings``,
``load_settings``), a model's section (``model``) and its tables (``model_tables``), the other
sections (``sections``), broker URLs parsed into nodes (``broker_urls``), MQTT topic filters
(``topic_filters``) and the defaults this machine gives (``machine``: how many serving
processes an unset ``http.workers`` means).

Imports ``livefit.models.names`` (builder and Keras names, checked without TensorFlow) and
``base``. ``machine`` moved here from the processes: a setting's default is the config's to
compute; the uvicorn protocol class that ``http`` settings used to build is built by
``runtime.http_server`` from ``http.connections`` instead.
"""
