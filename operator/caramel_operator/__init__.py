"""The Caramel operator: runs CaramelJobs as gangs of worker pods."""
