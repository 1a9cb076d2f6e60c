package trace

import (
	"strings"
	"testing"
	"time"
)

// Readers must turn any input into records or errors, never a panic.

func FuzzMooncake(f *testing.F) {
	f.Add(`{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}`)
	f.Add(`{"timestamp": 1e3, "input_length": 1, "output_length": 1, "hash_ids": []}` + "\n\n{}")
	f.Add(`{"timestamp": -1}`)
	f.Fuzz(func(t *testing.T, in string) {
		r := NewJitter(NewMooncake(strings.NewReader(in)), time.Second, 1)
		for range 1000 {
			if _, err := r.Next(); err != nil {
				return
			}
		}
	})
}

func FuzzAzure(f *testing.F) {
	f.Add("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6805900,374,44\r\n")
	f.Add("GeneratedTokens,TIMESTAMP,ContextTokens\n1,2023-11-16 18:15:46.6805900,2\n")
	f.Add("TIMESTAMP\n\"")
	f.Fuzz(func(t *testing.T, in string) {
		r := NewAzure(strings.NewReader(in))
		for range 1000 {
			if _, err := r.Next(); err != nil {
				return
			}
		}
	})
}
