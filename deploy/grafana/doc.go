// Package grafana checks vipgate's Grafana dashboard (deploy/helm/vipgate/dashboards/vipgate.json)
// against the metrics the code registers; see README.md. It has no code of its own.
package grafana
