"""The database "other" gets neither fencing's tables nor the guarded app."""


class NoFencingOnOther:
    def allow_migrate(self, db, app_label, **hints):
        if db == "other" and app_label in ("fencing", "guarded"):
            return False
        return None
