"""The node side: TPM access, the service client, ``nodegate join`` and ``nodegate renew``."""
