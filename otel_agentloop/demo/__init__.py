"""The simulated main job behind ``otel-agentloop simulate`` (an agent loop with no GPU and no model, in
process or on Ray). Nothing in the library imports it."""
