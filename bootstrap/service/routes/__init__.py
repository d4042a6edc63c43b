"""The join API's route handlers: HTTP in (``bootstrap.service.http``), the flows and the running
``bootstrap.service.state.Service`` behind them. Above ``state``, which holds the flows."""
