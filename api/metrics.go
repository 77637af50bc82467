package api

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type httpMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raftlockd_http_requests_total", Help: "HTTP requests by endpoint and status code."},
			[]string{"endpoint", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "raftlockd_http_request_seconds", Help: "HTTP request latency by endpoint and status code.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}, []string{"endpoint", "code"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.latency)
	}
	return m
}

func (m *httpMetrics) observe(endpoint string, status int, d time.Duration) {
	if status == 0 {
		status = 200
	}
	code := strconv.Itoa(status)
	m.requests.WithLabelValues(endpoint, code).Inc()
	m.latency.WithLabelValues(endpoint, code).Observe(d.Seconds())
}
