"""The operator: asking a person (prompters) and the one terminal sanitizer."""
