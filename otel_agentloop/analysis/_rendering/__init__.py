"""Rendering what ``_reading`` built: terminal text (``_terminal``, ``_display``, ``_waterfall``, ``_runs_text``,
``_compare_text``, ``_progress``), the self-contained pages (``_html``, ``_timeline_html``, ``_run_page``,
``_compare_html``: their CSS and JavaScript are package data in ``assets/``), the timeline PNG and Perfetto."""
