"""The `telemetry:` block of agent.yaml: OpenTelemetry traces of the runs.

```yaml
telemetry:
  otel: true             # export traces, as `--otel` does (OTEL_EXPORTER_OTLP_* says where)
  capture_content: false # prompts, answers, tool arguments and results on the spans
```

Both are off by default: nothing is exported unless asked for, and content stays out of the
spans unless asked for (or `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`).
Telemetry is not part of the resume fingerprint: turning it on changes no run.
"""

from __future__ import annotations

import attrs

__all__ = ["TelemetryConfig"]


@attrs.frozen
class TelemetryConfig:
    """Whether the command line exports OpenTelemetry traces, and whether they hold content."""

    otel: bool = False
    capture_content: bool = False
