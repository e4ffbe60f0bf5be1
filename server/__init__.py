"""The livefit server: ingestion, training, serving, metrics, HTTP app."""
