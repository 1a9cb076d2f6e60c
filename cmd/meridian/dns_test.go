package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/meridian-router/meridian/aws/route53/route53test"
	"github.com/meridian-router/meridian/internal/testkit"
)

// TestDNSCommand runs `meridian dns plan|apply` against a loopback Route 53
// with credentials from the environment (the SDK's standard chain).
func TestDNSCommand(t *testing.T) {
	srv := route53test.NewServer("AKIDDNSCMDTEST")
	defer srv.Close()
	srv.AddZone("example.com")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDDNSCMDTEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test-secret-not-a-secret")
	testkit.NoAWSConfig(t)
	run := func(args ...string) (string, error) {
		cmd := newDNSCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		err := cmd.Execute()
		return out.String(), err
	}
	common := []string{"--zone", "example.com", "--name", "api.example.com", "--endpoint-url", srv.URL,
		"--target", "us-east-1=lb-use1.example.net:80", "--target", "eu-west-1=lb-euw1.example.net:80"}

	out, err := run(append([]string{"plan"}, common...)...)
	if err != nil || !strings.Contains(out, "+ record us-east-1 CNAME lb-use1.example.net.") || srv.Mutations() != 0 {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	out, err = run(append([]string{"apply"}, common...)...)
	if err != nil || !strings.Contains(out, "applied: 2 health check(s) created, 2 record change(s)") {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	mutations := srv.Mutations()
	out, err = run(append([]string{"apply"}, common...)...)
	if err != nil || !strings.Contains(out, "no changes") || srv.Mutations() != mutations {
		t.Fatalf("second apply: %v\n%s", err, out)
	}

	// Usage errors exit 2.
	_, err = run("plan", "--zone", "example.com", "--endpoint-url", srv.URL)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 2 {
		t.Errorf("no --name: err = %v", err)
	}
	_, err = run("plan", "--zone", "example.com", "--name", "api.example.com", "--endpoint-url", srv.URL)
	if !errors.As(err, &ee) || ee.code != 2 {
		t.Errorf("no targets: err = %v", err)
	}
	// The example platform's loopback addresses cannot be health-checked.
	_, err = run("plan", "--zone", "example.com", "--name", "api.example.com", "--endpoint-url", srv.URL, "--config", "../../deploy/examples/platform")
	if err == nil || !strings.Contains(err.Error(), "cannot health-check") {
		t.Errorf("loopback topology: err = %v", err)
	}
}
