"""The hub's database backend: Django's PostgreSQL backend, whose pool checks a connection it lends with no
round trip when it needs none (see ``base``)."""
