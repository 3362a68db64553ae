//! The claim suite against a real RabbitMQ: 8 instances with 8 connections.

mod common;

anarchon_testkit::claim_suite!(crate::common::AmqpFactory::new().await);
