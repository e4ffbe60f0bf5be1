"""HTTP: the FastAPI app (``app``), the prediction protocols (TF Serving REST and the Open
Inference Protocol: ``protocols``, which re-exports ``tfserving``, ``oip``, ``oip_tensors`` and
``protocol_common``; ``predict_api``, ``openapi_docs``), connection limits and
admission from the request head (``connections``), the token guard (``auth``), the dashboard
(``dashboard``: its routes; ``dashboard_stats``, ``dashboard_page``) and the weights endpoints
(``weights_api``).

Imports: ``inference``, ``weights`` (the store it serves), ``labels``, ``config``, ``metrics``,
``metrics_merge``.
"""
