package dataplane

// Internals the external tests (package dataplane_test) use: those that check the engine on the
// gateway's tables, which they build through gateway/ (an internal test cannot import it: it
// imports this package).

// PackRoundTrip is packRoundTrip (compact_test.go).
var PackRoundTrip = packRoundTrip
