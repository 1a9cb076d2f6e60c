// Command fastfloor is the goproxy path of bench/latency built on
// valyala/fasthttp instead of net/http: a plain streaming reverse proxy
// (no authentication, limits or routing) whose cost shows how much of a Go
// front door's cost is net/http's server and client. It lives in its own
// module so that the main module does not depend on fasthttp.
//
//	go build -o /tmp/fastfloor ./bench/fastfloor      (from bench/fastfloor)
//	go run ./bench/latency --meridian /tmp/meridian --fastfloor /tmp/fastfloor -paths tier2,fastfloor,nginx
package main

import (
	"bufio"
	"flag"
	"io"
	"log"
	"time"

	"github.com/valyala/fasthttp"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	upstream := flag.String("upstream", "", "host:port of the Tier-1 to proxy to")
	flag.Parse()
	if *upstream == "" {
		log.Fatal("--upstream is required")
	}
	up := &fasthttp.HostClient{
		Addr:                *upstream,
		MaxConns:            1024,
		MaxIdleConnDuration: 90 * time.Second,
		ReadTimeout:         60 * time.Second,
		WriteTimeout:        10 * time.Second,
		StreamResponseBody:  true,
	}
	handler := func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/healthz" {
			return
		}
		req := fasthttp.AcquireRequest()
		ctx.Request.CopyTo(req)
		req.SetHost(*upstream)
		resp := fasthttp.AcquireResponse()
		if err := up.Do(req, resp); err != nil {
			fasthttp.ReleaseRequest(req)
			fasthttp.ReleaseResponse(resp)
			ctx.Error(err.Error(), fasthttp.StatusBadGateway)
			return
		}
		fasthttp.ReleaseRequest(req)
		ctx.SetStatusCode(resp.StatusCode())
		ctx.Response.Header.SetContentTypeBytes(resp.Header.ContentType())
		body := resp.BodyStream()
		if body == nil { // a body short enough to have been read whole
			ctx.SetBody(resp.Body())
			fasthttp.ReleaseResponse(resp)
			return
		}
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			defer fasthttp.ReleaseResponse(resp)
			buf := make([]byte, 16<<10)
			for {
				n, err := body.Read(buf)
				if n > 0 {
					w.Write(buf[:n])
					if w.Flush() != nil {
						return
					}
				}
				if err != nil {
					if err != io.EOF {
						log.Print(err)
					}
					return
				}
			}
		})
	}
	srv := &fasthttp.Server{Handler: handler, ReadTimeout: 60 * time.Second, WriteTimeout: 60 * time.Second}
	log.Fatal(srv.ListenAndServe(*listen))
}
