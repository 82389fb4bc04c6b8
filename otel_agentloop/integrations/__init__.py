"""Optional integrations; each imports its heavy dependency lazily and says what to install when missing."""
