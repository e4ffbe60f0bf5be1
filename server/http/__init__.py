"""HTTP: the FastAPI app and the ``Runtime`` protocol it serves (``app``); the prediction
protocols (TF Serving REST ``tfserving``, the Open Inference Protocol ``oip`` and
``oip_tensors``, their common parts ``protocol_common``, their OpenAPI documents
``openapi_docs``); the prediction routes (``predict_api``; a request's parts
``predict_request``; what the routes do ``predict_handlers``; the refusal from the request head
``early_admission``); connection limits (``connections``: the uvicorn protocol;
``connection_table``: the cap, eviction and deadline sweep; ``connection_limits``: the limits
and close responses); the token guard (``auth``) and the one lookup of a named model behind it
(``model_lookup``); the dashboard (``dashboard``, ``dashboard_stats``, ``dashboard_page``); the
labels route (``labels_api``) and the weights routes (``weights_api``).

Imports ``serve``, ``weights`` (the store it serves), ``labels``, ``wire``, ``config`` and
``base``.
"""
