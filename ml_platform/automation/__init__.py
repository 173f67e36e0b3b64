"""Automation: landing sensors, schedules, jobs, retries, concurrency tags and alerts."""
