package main

import (
	"strings"
	"testing"
)

// FuzzParseParticipant: nothing panics, an accepted participant has a key,
// and writing it back as namespace:key@backend_hash reads the same
// participant again.
func FuzzParseParticipant(f *testing.F) {
	for _, s := range []string{"k", "ns:k", "ns:k@h", "k@h", "ns:a:b@h", "orders/42@7f3a9c0", "", "ns:", "@h", "ns:@h",
		":k", "k@", "a@b@c", "::@@", "ns:k@h@", "\x00:\xff@"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := parseParticipant(s)
		if err != nil {
			if !strings.Contains(err.Error(), "[namespace:]key[@backend_hash]") {
				t.Fatalf("%q: error without the expected form: %v", s, err)
			}
			return
		}
		if p.Key == "" {
			t.Fatalf("%q: accepted without a key: %+v", s, p)
		}
		if strings.Contains(p.BackendHash, "@") || strings.Contains(p.Namespace, ":") {
			t.Fatalf("%q: split at the wrong separator: %+v", s, p)
		}
		again, err := parseParticipant(p.Namespace + ":" + p.Key + "@" + p.BackendHash)
		if err != nil || again != p {
			t.Fatalf("%q: parsed as %+v, which reads back as %+v (%v)", s, p, again, err)
		}
	})
}
