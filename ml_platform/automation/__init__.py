"""Automation: landing sensors, schedules, jobs, concurrency tags and alerts."""
