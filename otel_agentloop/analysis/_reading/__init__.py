"""Reading stored spans: OTLP-JSON records (``_decode``), trace folders (``_store``), Jaeger (``_jaeger``,
``_source``), runs (``_runs``, ``_run_load``, ``_summary_lines``), and the models built from them: a step's report
and verdicts (``_report``), its timeline (``_step_view``), the step from its stored summary (``_stored_step``), a
comparison of two steps (``_compare``, ``_comparison``); what a view is asked, typed (``_options``: never a command
line). Nothing here prints or draws; it never imports ``_rendering``."""
