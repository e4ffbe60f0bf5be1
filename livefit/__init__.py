"""livefit: real-time online learning and inference server (MQTT in, Keras training, HTTP out)."""

__version__ = "0.1.0"
