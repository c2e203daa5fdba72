"""Reading and checking job files: TOML, ``extends``, ``--set`` and where each value came from;
the host's own tables; resolving a job against the registered components; hiding secrets; the
distributed plan ``validate`` prints. Imports pydantic, never torch, accelerate or mlflow."""
