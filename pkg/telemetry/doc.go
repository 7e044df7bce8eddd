// Package telemetry is what rls reports about itself besides the decision
// metrics of pkg/service. It holds the store decorators that time and
// trace calls (MeteredStore, Tracing.Store), the OTLP exporter and its
// bounded span queue (NewTracing, ReadOTLPEnv), health (Health,
// HealthcheckHandler), and the collectors of the limiter, the fleet size,
// the Redis store and the config in force, read through interfaces
// declared here. The caller makes the registry; nothing registers
// globally but OpenTelemetry's logger and error handler, while tracing is
// on.
package telemetry
