"""``runjob sweep``'s engine: an Optuna study in durable storage (:mod:`.study`), the workers that
take its trials and run each as ``runjob run`` (:mod:`.worker`, :mod:`.devices`), and the parent
MLflow run that records the sweep (:mod:`.parent`). Nothing here is imported by ``runjob validate``
except :mod:`.study`'s plain helpers; Optuna is imported when a sweep starts."""
