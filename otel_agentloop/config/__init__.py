"""Settings: defaults, the standard ``OTEL_*`` and ``OTEL_AGENTLOOP_*`` environment, validation. Imports nothing
else of this package but ``semconv``.

``_settings`` declares every setting (``Settings``) and resolves them; ``_kinds`` how each kind of value is read,
checked and written; ``_values`` the checks and parsers they use; ``_options`` ``configure()``'s keyword options;
``_watchdog`` the watchdog's settings as one object; ``_environment`` the SDK's own variables, the check of the
environment and the one way the rest of the library reads a variable."""
