"""A small shop on fencing: a Flask app, a Celery worker and ``fencing relay``.

``shop.web`` pays and cancels orders (each a SQLAlchemy transaction that also writes the
next task's outbox row); ``shop.tasks`` ships (under a lease, in the worker's own
transaction: the order, its shipment and the ``notify`` message commit together) and
notifies; ``fencing relay`` publishes the outbox. See README.md.
"""
