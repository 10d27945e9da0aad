package cluster

import (
	"strings"
	"testing"
)

func TestServiceLBAlgorithm(t *testing.T) {
	for _, c := range []struct {
		ann     map[string]string
		want    LBAlgorithm
		wantErr string
	}{
		{nil, LBDefault, ""},
		{map[string]string{LBAlgorithmAnnotation: ""}, LBDefault, ""},
		{map[string]string{LBAlgorithmAnnotation: "random"}, LBRandom, ""},
		{map[string]string{LBAlgorithmAnnotation: " round-robin "}, LBRoundRobin, ""},
		{map[string]string{LBAlgorithmAnnotation: "source-hash"}, LBSourceHash, ""},
		{map[string]string{LBAlgorithmAnnotation: "maglev"}, LBMaglev, ""},
		{map[string]string{LBAlgorithmAnnotation: "rr"}, LBDefault, `unknown algorithm "rr" (want one of random, round-robin, source-hash, maglev); the default is used`},
		{map[string]string{LBAlgorithmAnnotation: "leastconn"}, LBDefault, "least-connection needs per-endpoint connection counts"},
		{map[string]string{LBAlgorithmAnnotation: strings.Repeat("x", 500)}, LBDefault, `"` + strings.Repeat("x", 64) + `..."`},
	} {
		got, err := ServiceLBAlgorithm(&Service{Annotations: c.ann})
		if got != c.want {
			t.Errorf("%v: got %q, want %q", c.ann, got, c.want)
		}
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%v: unexpected error %v", c.ann, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%v: error %v, want it to say %q", c.ann, err, c.wantErr)
		}
	}
}
