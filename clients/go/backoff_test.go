package relay

// Backoff: 1 s doubling to 30 s, each delay in the upper fifth of its step, back to 1 s on Reset; and ExecutorID.

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

func seconds(b *Backoff, count int) []float64 {
	out := make([]float64, count)
	for i := range out {
		out[i] = b.Next().Seconds()
	}
	return out
}

func TestDelaysDoubleFromOneSecondToThirtyJitteredDownwards(t *testing.T) {
	for seed := range uint64(20) {
		b := NewBackoff()
		b.Rand = rand.New(rand.NewPCG(seed, seed))
		delays := seconds(b, 40)
		for n, delay := range delays {
			step := min(30.0, float64(int64(1)<<min(n, 20)))
			if delay < 0.8*step || delay > step {
				t.Fatalf("seed %d: delay %d is %g, step %g", seed, n, delay, step)
			}
		}
		for n := 1; n <= 5; n++ { // the steps double: five in a row cannot all fall below 0.8 of theirs
			if delays[n] <= delays[n-1] {
				t.Fatalf("seed %d: %v", seed, delays[:6])
			}
		}
	}
}

func TestTheJitterSpreadsAFleet(t *testing.T) {
	firsts := map[time.Duration]bool{}
	low, high := false, false
	for seed := range uint64(50) {
		b := NewBackoff()
		b.Rand = rand.New(rand.NewPCG(seed, 7))
		first := b.Next()
		firsts[first] = true
		low = low || first < 850*time.Millisecond
		high = high || first > 950*time.Millisecond
	}
	if len(firsts) != 50 || !low || !high {
		t.Fatalf("%d distinct first delays, low %v, high %v", len(firsts), low, high)
	}
}

func TestResetReturnsToOneSecond(t *testing.T) {
	b := NewBackoff()
	b.Rand = rand.New(rand.NewPCG(7, 7))
	if last := seconds(b, 10)[9]; last < 24 {
		t.Fatalf("tenth delay %g", last)
	}
	b.Reset()
	if got := seconds(b, 2); got[0] < 0.8 || got[0] > 1 || got[1] < 1.6 || got[1] > 2 {
		t.Fatalf("after reset %v", got)
	}
	if b.Attempts() != 2 {
		t.Fatalf("attempts %d", b.Attempts())
	}
}

func TestAShorterScheduleAsTheTestsUseIt(t *testing.T) {
	b := &Backoff{Initial: 10 * time.Millisecond, Cap: 40 * time.Millisecond}
	var got []time.Duration
	for range 5 {
		got = append(got, b.Next())
	}
	want := []time.Duration{10, 20, 40, 40, 40}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("delays %v", got)
		}
	}
}

var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestTheSameExecutorIDTwiceInAProcess(t *testing.T) {
	first := ExecutorID()
	if ExecutorID() != first || !uuidPattern.MatchString(first) || first != env.executorID {
		t.Fatalf("executor id %q", first)
	}
}

func TestAnotherProcessDrawsAnotherExecutorID(t *testing.T) {
	child := exec.Command(os.Args[0])
	child.Env = append(os.Environ(), "PRINT_EXECUTOR_ID=1")
	out, err := child.Output()
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(string(out))
	if !uuidPattern.MatchString(id) || id == ExecutorID() {
		t.Fatalf("the child's id %q, this process's %q", id, ExecutorID())
	}
}
