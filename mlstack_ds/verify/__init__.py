"""`mlstack-ds verify`: run real training steps through the installed DeepSpeed on several ranks."""
