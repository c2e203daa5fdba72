"""``runjob sweep``'s room, all of it: the sweep coordinated (:mod:`.session`: created, joined,
resumed, its end recorded and summed up), its values checked (:mod:`.checks`), the Optuna study in
durable storage (:mod:`.study`), the workers that take its trials and run each as ``runjob run``
(:mod:`.worker`, :mod:`.devices`), a trial's own side, its pruner and the outcome it sends back
(:mod:`.trial`), and the parent MLflow run (:mod:`.parent`). Optuna is imported when a sweep starts."""
