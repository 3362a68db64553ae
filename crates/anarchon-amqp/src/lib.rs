//! anarchon's RabbitMQ backend (work in progress).
