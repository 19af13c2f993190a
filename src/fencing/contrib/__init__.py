"""Integrations with task queues, ORMs and telemetry. The core never imports these."""
