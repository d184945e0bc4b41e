"""The one size unit the app counts in: decimal gigabytes, as disks, the Hub and Lemonade's ``size``
fields count them (not GiB)."""

GB = 1e9  # bytes
