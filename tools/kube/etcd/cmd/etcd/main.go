// Command etcd is etcd v3.6 built from go.etcd.io/etcd/server/v3, exactly as the upstream
// etcd binary's main package does it (go.etcd.io/etcd/v3 main.go calls etcdmain.Main).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
