"""Readers of the host the exporter runs on: procfs (`procfs`) and cgroup paths (`cgroup`).

Every read is blocking: collectors call them in a worker thread with a deadline. Attribution, the
engines collector and the page cache share these readers; nothing here knows about collectors.
"""
