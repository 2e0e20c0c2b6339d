"""Locust load tests (land with the deploy and load-test issue)."""
