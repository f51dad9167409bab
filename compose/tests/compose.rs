//! The Compose loader against real files in a temporary project directory.

use std::collections::BTreeMap;
use std::path::Path;

use ployz_compose::{load, parse_port, ComposeErrors, ComposeInput, ComposeWarning, LoadedProject};
use ployz_core::{
    ConfigFile, ConfiguredHealthcheck, ContainerSpec, Healthcheck, HostProtocol, IngressProtocol,
    Logging, Mount, PathMatch, PortSpec, PreDeployHook, PullPolicy, Resources, RouteSpec,
    ServiceMode, ServiceSpec, Ulimit, UpdateConfig, UpdateOrder, VolumeSpec,
};

/// Writes `files` (name, content) into a fresh directory.
fn project(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, content) in files {
        let path = dir.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(path, content).unwrap();
    }
    dir
}

fn input(dir: &Path, files: &[&str], env: &[(&str, &str)], profiles: &[&str]) -> ComposeInput {
    ComposeInput {
        files: files.iter().map(|f| dir.join(f)).collect(),
        profiles: profiles.iter().map(|p| p.to_string()).collect(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// Loads a single `compose.yaml` with an empty environment.
fn load_yaml(yaml: &str) -> Result<LoadedProject, ComposeErrors> {
    let dir = project(&[("compose.yaml", yaml)]);
    load(&input(dir.path(), &["compose.yaml"], &[], &[]))
}

fn ok(yaml: &str) -> LoadedProject {
    load_yaml(yaml).unwrap_or_else(|e| panic!("expected the project to load:\n{e}"))
}

fn service<'a>(p: &'a LoadedProject, name: &str) -> &'a ServiceSpec {
    p.services
        .iter()
        .find(|s| s.name.as_str() == name)
        .unwrap_or_else(|| panic!("no service {name}"))
}

fn names(p: &LoadedProject) -> Vec<&str> {
    p.services.iter().map(|s| s.name.as_str()).collect()
}

fn warning<'a>(p: &'a LoadedProject, key: &str) -> &'a ComposeWarning {
    p.warnings
        .iter()
        .find(|w| w.key == key)
        .unwrap_or_else(|| panic!("no warning for {key}: {:#?}", p.warnings))
}

// ---- broken files -------------------------------------------------------------------------

const LONG_LABEL: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"; // 64

#[test]
fn a_redirect_route_keeps_its_target_without_a_trailing_slash() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("compose.yaml"),
        "services:\n  web:\n    image: nginx\n    x-ports: [example.com:80/https, www.example.com:80/https]\n    x-routes:\n      - {hostname: www.example.com, redirect: HTTPS://Example.com/}\n      - {hostname: example.com, path: /old, strip_prefix: true, redirect: https://example.com/new/, status: 301}\n",
    )
    .unwrap();
    let project = load(&ComposeInput {
        files: vec![dir.path().join("compose.yaml")],
        profiles: vec![],
        env: Default::default(),
    })
    .unwrap();
    let web = &project.services[0];
    let redirects: Vec<String> = web
        .served_paths()
        .iter()
        .map(|p| {
            format!(
                "{}{} -> {}",
                p.hostname,
                p.path,
                p.redirect
                    .map_or("-".to_owned(), |r| format!("{} {}", r.status, r.to))
            )
        })
        .collect();
    assert_eq!(
        redirects,
        [
            "example.com/old/* -> 301 https://example.com/new",
            "www.example.com/* -> 308 https://example.com",
        ]
    );
}

#[test]
fn services_share_a_hostname_by_path() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("compose.yaml"),
        "services:\n  web:\n    image: nginx\n    x-ports: [app.example.com:80]\n  api:\n    image: api\n    x-ports: [app.example.com:8080/http]\n    x-routes: [{path: /api, strip_prefix: true}, {exact: /api/health}]\n",
    )
    .unwrap();
    let project = load(&ComposeInput {
        files: vec![dir.path().join("compose.yaml")],
        profiles: vec![],
        env: Default::default(),
    })
    .unwrap();
    let api = project
        .services
        .iter()
        .find(|s| s.name.as_str() == "api")
        .unwrap();
    let served: Vec<String> = api
        .served_paths()
        .iter()
        .map(|p| {
            format!(
                "{}{} {} strip={}",
                p.hostname, p.path, p.container_port, p.strip_prefix
            )
        })
        .collect();
    assert_eq!(
        served,
        [
            "app.example.com/api/* 8080 strip=true",
            "app.example.com= /api/health 8080 strip=false"
        ]
    );
    let web = project
        .services
        .iter()
        .find(|s| s.name.as_str() == "web")
        .unwrap();
    assert_eq!(web.served_paths()[0].path, PathMatch::root());
}

#[test]
fn broken_files_fail_with_errors_that_name_the_problem() {
    let long_host = format!("{}.com", ["abcdefghij"; 24].join("."));
    let long_name = "s".repeat(64);
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "service name with a space",
            "services:\n  my app:\n    image: nginx\n".into(),
            vec!["service 'my app'", "has ' ' at position 3", "letters, digits, '_', '.' and '-'"],
        ),
        (
            "path-like service name",
            "services:\n  ../x:\n    image: nginx\n".into(),
            vec!["service '../x'", "has '/' at position 3"],
        ),
        (
            "service name too long",
            format!("services:\n  {long_name}:\n    image: nginx\n"),
            vec!["is 64 characters long; the limit is 63"],
        ),
        (
            "host port range for one container port",
            "services:\n  web:\n    image: nginx\n    ports: [\"8000-8001:80\"]\n".into(),
            vec!["service 'web': ports[0] '8000-8001:80': the host port range 8000-8001 for the one container port 80 would let Docker pick any port of it, and the plan could not say which; publish one host port ('8000:80'), or leave the host port out ('80') for Docker to pick a free one"],
        ),
        (
            "one host port bound on every address and on one address",
            "services:\n  web:\n    image: nginx\n    ports: [\"8080:80\", \"127.0.0.1:8080:81\", \"0.0.0.0:9090:90\", \"10.0.0.5:9090:91\"]\n".into(),
            vec![
                "host port 8080 is bound twice (to container ports 80 and 81)",
                "host port 9090 is bound twice (to container ports 90 and 91)",
            ],
        ),
        (
            "host port range for one container port, with a host IP kept in the hint",
            "services:\n  web:\n    image: nginx\n    ports: [\"127.0.0.1:8000-8001:80\", \"[::1]:7000-7002:9000-9001\"]\n".into(),
            vec![
                "publish one host port ('127.0.0.1:8000:80'), or leave the host port out ('127.0.0.1::80')",
                "e.g. '[::1]:9000-9001:9000-9001'",
            ],
        ),
        (
            "ranges of different lengths",
            "services:\n  web:\n    image: nginx\n    ports: [\"8000-8010:9000-9005\"]\n".into(),
            vec!["ports[0] '8000-8010:9000-9005'", "the host ports 8000-8010 hold 11 port(s) but the container ports 9000-9005 hold 6", "e.g. '9000-9005:9000-9005'"],
        ),
        (
            "one host port for a container range",
            "services:\n  web:\n    image: nginx\n    ports: [\"8000:80-81\"]\n".into(),
            vec!["ports[0] '8000:80-81'", "the host ports 8000 hold 1 port(s) but the container ports 80-81 hold 2"],
        ),
        (
            "backwards range",
            "services:\n  web:\n    image: nginx\n    ports: [\"90-80\"]\n".into(),
            vec!["ports[0] '90-80'", "the container port range '90-80' ends before it starts", "'80-90'"],
        ),
        (
            "sctp port",
            "services:\n  web:\n    image: nginx\n    ports: [\"9000:9000/sctp\"]\n".into(),
            vec!["ports[0] '9000:9000/sctp'", "sctp ports are not supported", "use tcp or udp"],
        ),
        (
            "unknown protocol in the long syntax",
            "services:\n  web:\n    image: nginx\n    ports: [{target: 80, protocol: http}]\n".into(),
            vec!["ports[0].protocol 'http'", "unknown protocol 'http'", "use tcp or udp"],
        ),
        (
            "host IP that is not an address",
            "services:\n  web:\n    image: nginx\n    ports: [\"localhost:8080:80\"]\n".into(),
            vec!["ports[0] 'localhost:8080:80'", "'localhost' is not an IP address"],
        ),
        (
            "short port out of range",
            "services:\n  web:\n    image: nginx\n    ports: [\"70000:80\"]\n".into(),
            vec!["ports[0] '70000:80'", "the published port 70000 is out of range"],
        ),
        (
            "a host port in both ports and x-ports",
            "services:\n  web:\n    image: nginx\n    ports: [\"8080:80\"]\n    x-ports: [\"8080:81/tcp@host\", \"app.example.com:80\"]\n".into(),
            vec!["service 'web': ports and x-ports '8080:81/tcp@host': host port 8080 is bound twice (to container ports 80 and 81)"],
        ),
        (
            "ports together with x-ports, each with its own problems",
            "services:\n  web:\n    image: nginx\n    ports: [\"8000-8001:80\"]\n    x-ports: [\"bad host.com:80\"]\n    deploy:\n      mode: daemonset\n".into(),
            vec![
                "the host port range 8000-8001 for the one container port 80",
                "'bad host.com' is not a valid hostname",
                "deploy.mode 'daemonset'",
            ],
        ),
        (
            "long syntax port with a range for one target",
            "services:\n  web:\n    image: nginx\n    ports:\n      - target: 80\n        published: 8000-8001\n".into(),
            vec!["ports[0].published '8000-8001'", "the host port range 8000-8001 for the one container port 80"],
        ),
        (
            "long syntax port with an unknown mode",
            "services:\n  web:\n    image: nginx\n    ports:\n      - target: 80\n        published: 8080\n        mode: swarm\n".into(),
            vec!["ports[0].mode 'swarm'", "unknown port mode", "mode: host or ingress", "x-ports"],
        ),
        (
            "whitespace in a port is the port's",
            "services:\n  web:\n    image: nginx\n    x-ports: [\"app.example.com:80 80/https\"]\n".into(),
            vec!["x-ports[0]", "a port must not contain whitespace"],
        ),
        (
            "unknown update order",
            "services:\n  web:\n    image: nginx\n    deploy:\n      update_config:\n        order: sideways\n".into(),
            vec!["deploy.update_config.order 'sideways'", "unknown update order", "start-first or stop-first"],
        ),
        (
            "invalid deploy mode",
            "services:\n  web:\n    image: nginx\n    deploy:\n      mode: daemonset\n".into(),
            vec!["deploy.mode 'daemonset'", "unknown deploy mode", "replicated or global"],
        ),
        (
            "duplicate service in one file",
            "services:\n  web:\n    image: nginx\n  web:\n    image: httpd\n".into(),
            vec!["duplicate service 'web'"],
        ),
        (
            "duplicate key inside a service",
            "services:\n  web:\n    image: nginx\n    image: httpd\n".into(),
            vec!["service 'web'", "duplicate key 'image'"],
        ),
        (
            "required variable not set",
            "services:\n  web:\n    image: nginx\n    environment:\n      DB_PASS: ${DB_PASS:?set the database password}\n".into(),
            vec!["environment.DB_PASS", "required variable 'DB_PASS' is not set: set the database password"],
        ),
        (
            "hostname with a space",
            "services:\n  web:\n    image: nginx\n    x-ports: [\"bad host.com:80\"]\n".into(),
            vec!["x-ports[0] 'bad host.com:80'", "'bad host.com' is not a valid hostname", "' ' is not allowed"],
        ),
        (
            "hostname with an empty label",
            "services:\n  web:\n    image: nginx\n    x-ports: [\"a..b.com:80\"]\n".into(),
            vec!["'a..b.com' is not a valid hostname", "empty label"],
        ),
        (
            "hostname with a brace",
            "services:\n  web:\n    image: nginx\n    x-ports: [\"{x}.com:80\"]\n".into(),
            vec!["'{x}.com' is not a valid hostname", "'{' is not allowed"],
        ),
        (
            "hostname label over 63",
            format!("services:\n  web:\n    image: nginx\n    x-ports: [\"{LONG_LABEL}.com:80\"]\n"),
            vec!["is 64 characters long; the limit is 63"],
        ),
        (
            "hostname over 253",
            format!("services:\n  web:\n    image: nginx\n    x-ports: [\"{long_host}:80\"]\n"),
            vec!["the limit is 253"],
        ),
        (
            "hostname without a dot",
            "services:\n  web:\n    image: nginx\n    x-ports: [\"intranet:80\"]\n".into(),
            vec!["'intranet' is not a valid hostname", "has no dot"],
        ),
        (
            "two services claim one Ingress Hostname",
            "services:\n  web:\n    image: nginx\n    x-ports: [\"app.example.com:80\"]\n  api:\n    image: api\n    x-ports: [\"APP.example.com:8080/http\"]\n".into(),
            vec!["Ingress Hostname 'app.example.com' is claimed by services 'api' and 'web'"],
        ),
        (
            "two services route one path of a hostname",
            "services:\n  web:\n    image: nginx\n    x-ports: [\"app.example.com:80\"]\n    x-routes: [{path: /api/}]\n  api:\n    image: api\n    x-ports: [\"APP.example.com:8080/http\"]\n    x-routes: [{path: /api}]\n".into(),
            vec!["x-routes 'app.example.com/api'", "the path /api/* of 'app.example.com' is routed by services 'api' and 'web'", "another path in x-routes"],
        ),
        (
            "x-caddy",
            "services:\n  web:\n    image: nginx\n    x-caddy: |\n      example.com {\n        reverse_proxy {{upstreams 80}}\n      }\n".into(),
            vec!["x-caddy is not supported", "x-ports", "app.example.com:8080/https"],
        ),
        (
            "missing image",
            "services:\n  web:\n    command: [sleep, infinity]\n".into(),
            vec!["service 'web': image", "has no image"],
        ),
        (
            "build without a Dockerfile",
            "services:\n  web:\n    build: .\n".into(),
            vec!["service 'web': build.dockerfile 'Dockerfile': no Dockerfile at", "point build.dockerfile at it"],
        ),
        (
            "build from a folder that is not there",
            "services:\n  web:\n    build: ./nowhere\n".into(),
            vec!["build.context './nowhere': no folder at", "relative to the Compose file"],
        ),
        (
            "build from a remote context",
            "services:\n  web:\n    build: https://github.com/example/app.git\n".into(),
            vec!["a remote build context is not supported", "clone it"],
        ),
        (
            "a build key that is not one",
            "services:\n  web:\n    build:\n      contxt: .\n".into(),
            vec!["build.contxt", "'contxt' is not a key of build"],
        ),
        (
            "undeclared named volume",
            "services:\n  db:\n    image: postgres\n    volumes: [\"pgdata:/var/lib/postgresql/data\"]\n".into(),
            vec!["volumes[0] 'pgdata'", "not declared in the top-level volumes:"],
        ),
        (
            "depends_on an unknown service",
            "services:\n  web:\n    image: nginx\n    depends_on: [ghost]\n".into(),
            vec!["depends_on[0] 'ghost'", "depends on 'ghost', which is not a service"],
        ),
        (
            "depends_on cycle",
            "services:\n  a:\n    image: x\n    depends_on: [b]\n  b:\n    image: x\n    depends_on: [c]\n  c:\n    image: x\n    depends_on: [a]\n".into(),
            vec!["depends_on forms a cycle: a -> b -> c -> a"],
        ),
        (
            "duration without unit",
            "services:\n  web:\n    image: nginx\n    stop_grace_period: 10\n".into(),
            vec!["stop_grace_period '10'", "needs a unit", "'10s'"],
        ),
        (
            "duration with an unknown unit",
            "services:\n  web:\n    image: nginx\n    healthcheck:\n      test: [CMD, true]\n      interval: 3d\n".into(),
            vec!["healthcheck.interval '3d'", "unknown unit 'd'"],
        ),
        (
            "container port 0",
            "services:\n  web:\n    image: nginx\n    x-ports: [\"0/https\"]\n".into(),
            vec!["x-ports[0] '0/https'", "out of range; ports are 1-65535"],
        ),
        (
            "port 70000",
            "services:\n  web:\n    image: nginx\n    x-ports: [\"app.example.com:70000\"]\n".into(),
            vec!["70000 is out of range"],
        ),
        (
            "x-ports without protocol or hostname",
            "services:\n  web:\n    image: nginx\n    x-ports: [\"8000\"]\n".into(),
            vec!["x-ports[0] '8000'", "neither a hostname nor a protocol", "'8000/https'"],
        ),
        (
            "missing env_file",
            "services:\n  web:\n    image: nginx\n    env_file: missing.env\n".into(),
            vec!["env_file 'missing.env'", "does not exist"],
        ),
        (
            "negative replicas",
            "services:\n  web:\n    image: nginx\n    deploy:\n      replicas: -2\n".into(),
            vec!["deploy.replicas '-2'", "must not be negative"],
        ),
        (
            "bogus pull_policy",
            "services:\n  web:\n    image: nginx\n    pull_policy: sometimes\n".into(),
            vec!["pull_policy 'sometimes'", "unknown pull policy", "always, missing"],
        ),
        (
            "pull_policy build",
            "services:\n  web:\n    image: nginx\n    pull_policy: build\n".into(),
            vec!["pull_policy 'build'", "pull_policy build needs build:"],
        ),
        (
            "invalid YAML",
            "services:\n  web: [image: nginx\n".into(),
            vec!["compose.yaml: not valid YAML"],
        ),
        (
            "empty file",
            "".into(),
            vec!["the file is empty"],
        ),
        (
            "x-routes path that is a pattern",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - path: ^/api.*\n".into(),
            vec!["x-routes[0].path", "^/api.*", "plain text, not patterns", "write a path such as /api"],
        ),
        (
            "x-routes path with a dot segment",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - path: /a/../b\n".into(),
            vec!["x-routes[0].path", "no . or .. segment"],
        ),
        (
            "x-routes hostname not published",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - hostname: b.example.com\n        path: /api\n".into(),
            vec!["x-routes[0].hostname", "b.example.com", "does not publish in x-ports", "a.example.com"],
        ),
        (
            "x-routes without a hostname among several",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http, b.example.com:80/http]\n    x-routes:\n      - path: /api\n".into(),
            vec!["x-routes[0]", "publishes 2 hostnames", "hostname:"],
        ),
        (
            "x-routes strip_prefix on an exact path",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - exact: /healthz\n        strip_prefix: true\n".into(),
            vec!["x-routes[0].strip_prefix", "needs a path prefix other than /", "= /healthz"],
        ),
        (
            "x-routes entry with neither path nor exact",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - strip_prefix: true\n".into(),
            vec!["x-routes[0]", "needs path:"],
        ),
        (
            "x-routes allow entry that is no network",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - {path: /admin, allow: [10.0.0.0/8, office]}\n".into(),
            vec!["x-routes[0].allow", "'office'", "is not an IP address or network"],
        ),
        (
            "an Ingress Port taken by two services",
            "services:\n  a:\n    image: nginx\n    x-ports: [5432/tcp]\n  b:\n    image: nginx\n    x-ports: ['5432:15432/tcp']\n".into(),
            vec!["x-ports '5432/tcp'", "port 5432/tcp is taken by services 'a' and 'b'", "held on every Machine's edge"],
        ),
        (
            "an Ingress Port another service binds as a host port",
            "services:\n  a:\n    image: nginx\n    x-ports: [53/udp]\n  b:\n    image: nginx\n    ports: ['53:53/udp']\n".into(),
            vec!["port 53/udp is taken by services 'a' and 'b'"],
        ),
        (
            "an Ingress Port published twice",
            "services:\n  a:\n    image: nginx\n    x-ports: [5432/tcp, '5432:6000/tcp']\n".into(),
            vec!["Ingress Port 5432/tcp is published twice (to container ports 5432 and 6000)"],
        ),
        (
            "an Ingress Port with a hostname",
            "services:\n  a:\n    image: nginx\n    x-ports: [db.example.com:5432/tcp]\n".into(),
            vec!["'db.example.com' is not a port: a tcp ingress port has no hostname"],
        ),
        (
            "x-routes path with an encoded letter",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - path: /%61dmin\n".into(),
            vec!["x-routes[0].path", "not percent-encoded"],
        ),
        (
            "x-routes path with a path parameter",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - path: /admin;v=1\n".into(),
            vec!["x-routes[0].path", "has no ;"],
        ),
        (
            "x-routes empty allow list",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - {path: /admin, allow: []}\n".into(),
            vec!["x-routes[0].allow", "would admit no one"],
        ),
        (
            "x-routes header the edge decides",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - response_headers: {set: {Content-Length: '5'}}\n".into(),
            vec!["x-routes[0].response_headers.set", "Content-Length", "decides the content-length field itself"],
        ),
        (
            "x-routes forwarding field on a request",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - request_headers: {remove: [X-Forwarded-For]}\n".into(),
            vec!["x-routes[0].request_headers.remove", "X-Forwarded-For", "forwarding fields are the edge's"],
        ),
        (
            "x-routes header value on two lines",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - response_headers: {add: {X-A: \"a\\nb\"}}\n".into(),
            vec!["x-routes[0].response_headers.add.x-a", "one line of at most 4096 bytes"],
        ),
        (
            "x-routes header name",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - response_headers: {set: {'X A': b}}\n".into(),
            vec!["x-routes[0].response_headers.set", "'X A'", "is not a header field name"],
        ),
        (
            "x-routes redirect to itself",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - redirect: https://A.example.com/x\n".into(),
            vec!["x-routes[0].redirect", "https://a.example.com/x", "back to itself", "redirect to another hostname"],
        ),
        (
            "x-routes redirect that is not a URL",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - redirect: example.com?x\n".into(),
            vec!["x-routes[0].redirect", "goes to http:// or https://"],
        ),
        (
            "x-routes redirect status",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http, www.a.example.com:80/http]\n    x-routes:\n      - {hostname: www.a.example.com, redirect: https://a.example.com, status: 200}\n".into(),
            vec!["x-routes[0].status", "'200'", "301, 302, 303, 307 or 308"],
        ),
        (
            "x-routes status without a redirect",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - {path: /a, status: 301}\n".into(),
            vec!["x-routes[0].status", "has no redirect:"],
        ),
        (
            "x-routes the same path twice",
            "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n      - path: /api\n      - path: /api/\n".into(),
            vec!["x-routes[1]", "same path of one hostname", "a.example.com/api/*"],
        ),
        (
            "x-revisions out of range",
            "services:\n  web:\n    image: nginx\n    x-revisions: 0\n".into(),
            vec!["x-revisions", "keeps 1 to 100 Service Revisions", "leave it out to keep 5"],
        ),
        (
            "x-revisions not a number",
            "services:\n  web:\n    image: nginx\n    x-revisions: lots\n".into(),
            vec!["x-revisions", "lots"],
        ),
        (
            "x-pre_deploy without command",
            "services:\n  web:\n    image: nginx\n    x-pre_deploy:\n      timeout: 1m\n".into(),
            vec!["x-pre_deploy needs command:"],
        ),
        (
            "external secret",
            "services:\n  web:\n    image: nginx\nsecrets:\n  token:\n    external: true\n".into(),
            vec!["secrets.token.external", "external secrets are not supported"],
        ),
        (
            "undeclared config",
            "services:\n  web:\n    image: nginx\n    configs:\n      - source: nginx\n".into(),
            vec!["configs[0].source 'nginx'", "not declared in the top-level configs:"],
        ),
        (
            "dependency in a disabled profile",
            "services:\n  web:\n    image: nginx\n    depends_on: [debug]\n  debug:\n    image: busybox\n    profiles: [tools]\n".into(),
            vec!["depends on 'debug', which is in a profile that is not enabled", "-p tools"],
        ),
        (
            "global service with replicas",
            "services:\n  agent:\n    image: agent\n    deploy:\n      mode: global\n      replicas: 2\n".into(),
            vec!["deploy.mode 'global'", "cannot also set replicas"],
        ),
        (
            "invalid interpolation",
            "services:\n  web:\n    image: nginx\n    command: echo $1\n".into(),
            vec!["command 'echo $1'", "not a variable reference", "'$$'"],
        ),
        (
            "unsupported YAML tag",
            "services:\n  web:\n    image: !custom nginx\n".into(),
            vec!["the YAML tag '!custom' is not supported"],
        ),
        (
            "host port bound twice",
            "services:\n  web:\n    image: nginx\n    x-ports: [\"8080:80@host\", \"8080:81/tcp@host\"]\n".into(),
            vec!["host port 8080 is bound twice"],
        ),
        (
            "healthcheck disable with test",
            "services:\n  web:\n    image: nginx\n    healthcheck:\n      test: [CMD, true]\n      disable: true\n".into(),
            vec!["disable: true and a test cannot be combined"],
        ),
        (
            "mount target not absolute",
            "services:\n  web:\n    image: nginx\n    volumes: [\"/srv:srv\"]\n".into(),
            vec!["volumes[0] 'srv'", "absolute path"],
        ),
        (
            "include",
            "include: [other.yaml]\nservices:\n  web:\n    image: nginx\n".into(),
            vec!["include is not supported", "-f"],
        ),
    ];
    assert!(cases.len() >= 30);
    for (what, yaml, expected) in &cases {
        let err = match load_yaml(yaml) {
            Ok(p) => panic!("{what}: expected an error, loaded {:?}", names(&p)),
            Err(e) => e.to_string(),
        };
        for want in expected {
            assert!(err.contains(want), "{what}: expected {want:?} in:\n{err}");
        }
        assert!(
            err.contains("compose.yaml"),
            "{what}: the file is named:\n{err}"
        );
    }
}

#[test]
fn every_error_of_a_project_is_reported_at_once() {
    let err = load_yaml(
        "services:\n  we b:\n    image: nginx\n  api:\n    x-ports: [\"8000\"]\n  db:\n    image: postgres\n    deploy:\n      mode: daemonset\n",
    )
    .unwrap_err();
    let lines: Vec<String> = err.0.iter().map(|e| e.to_string()).collect();
    assert_eq!(err.0.len(), 4, "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains("service 'we b'")));
    assert!(lines
        .iter()
        .any(|l| l.contains("service 'api': x-ports[0] '8000'")));
    assert!(lines.iter().any(|l| l.contains("service 'api': image")));
    assert!(lines
        .iter()
        .any(|l| l.contains("service 'db': deploy.mode 'daemonset'")));
    assert_eq!(err.to_string().lines().count(), 4);
    let e = &err
        .0
        .iter()
        .find(|e| e.key.as_deref() == Some("deploy.mode"))
        .unwrap();
    assert_eq!(e.service.as_deref(), Some("db"));
    assert_eq!(e.value.as_deref(), Some("daemonset"));
    assert_eq!(e.fix.as_deref(), Some("use replicated or global"));
    assert!(e.file.ends_with("compose.yaml"));
}

#[test]
fn a_missing_compose_file_is_named() {
    let dir = project(&[("compose.yaml", "services:\n  web:\n    image: nginx\n")]);
    let err = load(&input(dir.path(), &["compose.yaml", "prod.yaml"], &[], &[])).unwrap_err();
    assert_eq!(err.0.len(), 1);
    let e = &err.0[0];
    assert!(e.file.ends_with("prod.yaml"), "{e}");
    assert!(e.message.contains("does not exist"), "{e}");
    let none = load(&ComposeInput::default()).unwrap_err();
    assert!(none.to_string().contains("no Compose file was given"));
}

#[test]
fn an_error_in_an_override_file_names_that_file() {
    let dir = project(&[
        ("compose.yaml", "services:\n  web:\n    image: nginx\n"),
        (
            "prod.yaml",
            "services:\n  web:\n    deploy:\n      update_config:\n        order: sideways\n",
        ),
    ]);
    let err = load(&input(dir.path(), &["compose.yaml", "prod.yaml"], &[], &[])).unwrap_err();
    assert_eq!(err.0.len(), 1, "{err}");
    assert!(err.0[0].file.ends_with("prod.yaml"), "{err}");
}

// ---- a full-featured file -----------------------------------------------------------------

const FULL: &str = r#"
name: shop
version: "3.9"
x-context: prod
x-common: &common
  LOG_LEVEL: info
services:
  web:
    image: ghcr.io/acme/web:1.2
    command: ./server --name "my shop" -v
    entrypoint: ["/sbin/tini", "--"]
    env_file: web.env
    environment:
      <<: *common
      DATABASE_URL: postgres://db:5432/shop
      FROM_ENV:
      PORT: 8080
    healthcheck:
      test: curl -f http://localhost:8080/health
      interval: 30s
      timeout: 5s
      retries: 3
      start_period: 1m30s
      start_interval: 500ms
    x-ports:
      - shop.example.com:8080
      - 9090/http
      - Shop.Example.com:8080/https
      - 8443:443/tcp@host
    x-routes:
      - path: /api/
        strip_prefix: true
      - exact: /healthz
      - hostname: Shop.Example.com
        path: /
    volumes:
      - data:/var/lib/shop
      - /etc/ssl/certs:/etc/ssl/certs:ro
      - type: tmpfs
        target: /tmp
        tmpfs:
          size: 64m
          mode: 01777
    user: "1000:1000"
    init: true
    cap_add: [SYS_PTRACE, NET_ADMIN, NET_ADMIN]
    cap_drop: [MKNOD]
    sysctls:
      - net.core.somaxconn=1024
    ulimits:
      nofile: { soft: 1024, hard: 4096 }
      nproc: 512
    shm_size: 64m
    stop_grace_period: 1m
    cpus: 0.5
    mem_limit: 512m
    deploy:
      mode: replicated
      replicas: 3
      resources:
        limits: { cpus: "1.5", memory: 1g }
        reservations: { memory: 256m }
      update_config:
        order: start-first
        monitor: 10s
    x-machines: "m2, m1,m2"
    x-pre_deploy:
      command: ./migrate up
      environment: [MIGRATE=1]
      timeout: 2m
    x-revisions: 12
    depends_on:
      db:
        condition: service_healthy
    pull_policy: always
    logging:
      driver: local
      options: { max-size: 10m, max-file: 3 }
    configs:
      - source: nginx
        target: /etc/nginx/nginx.conf
        mode: 0440
        uid: "101"
        gid: 101
      - source: motd
  db:
    image: postgres:16
    volumes: [db:/var/lib/postgresql/data]
volumes:
  data:
    name: shop-data
    labels: { team: shop }
  db: {}
  unused: {}
configs:
  nginx:
    file: ./conf/nginx.conf
  motd:
    content: "hello ${USER_NAME}"
"#;

fn full_web_spec() -> ServiceSpec {
    let mut hc = ConfiguredHealthcheck::new(vec![
        "CMD-SHELL".into(),
        "curl -f http://localhost:8080/health".into(),
    ])
    .unwrap();
    hc.interval_ms = Some(30_000);
    hc.timeout_ms = Some(5_000);
    hc.retries = Some(3);
    hc.start_period_ms = Some(90_000);
    hc.start_interval_ms = Some(500);
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let map = |v: &[(&str, &str)]| {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    ServiceSpec {
        name: "web".parse().unwrap(),
        mode: ServiceMode::Replicated,
        replicas: 3,
        container: ContainerSpec {
            image: "ghcr.io/acme/web:1.2".into(),
            command: Some(s(&["./server", "--name", "my shop", "-v"])),
            entrypoint: Some(s(&["/sbin/tini", "--"])),
            env: map(&[
                ("DATABASE_URL", "postgres://db:5432/shop"),
                ("FROM_ENV", "from the shell"),
                ("LOG_LEVEL", "info"),
                ("PORT", "8080"),
                ("SECRET", "s3cr3t # not a comment"),
            ]),
            healthcheck: Some(Healthcheck::Configured(hc)),
            user: Some("1000:1000".into()),
            init: Some(true),
            privileged: false,
            cap_add: s(&["NET_ADMIN", "SYS_PTRACE"]),
            cap_drop: s(&["MKNOD"]),
            sysctls: map(&[("net.core.somaxconn", "1024")]),
            ulimits: [
                (
                    "nofile".to_string(),
                    Ulimit {
                        soft: 1024,
                        hard: 4096,
                    },
                ),
                (
                    "nproc".to_string(),
                    Ulimit {
                        soft: 512,
                        hard: 512,
                    },
                ),
            ]
            .into(),
            shm_size_bytes: Some(64 << 20),
            stop_grace_period_ms: Some(60_000),
            resources: Resources {
                nano_cpus: Some(1_500_000_000),
                memory_limit_bytes: Some(1 << 30),
                memory_reservation_bytes: Some(256 << 20),
            },
            mounts: vec![
                Mount::Bind {
                    source: "/etc/ssl/certs".into(),
                    target: "/etc/ssl/certs".into(),
                    read_only: true,
                },
                Mount::Tmpfs {
                    target: "/tmp".into(),
                    size_bytes: Some(64 << 20),
                    mode: Some(0o1777),
                },
                Mount::Volume {
                    source: "shop-data".into(),
                    target: "/var/lib/shop".into(),
                    read_only: false,
                    no_copy: false,
                },
            ],
            pull_policy: PullPolicy::Always,
            logging: Some(Logging {
                driver: "local".into(),
                options: map(&[("max-file", "3"), ("max-size", "10m")]),
            }),
            configs: vec![
                ConfigFile {
                    name: "nginx".into(),
                    target: "/etc/nginx/nginx.conf".into(),
                    content: "worker_processes 1;\n".into(),
                    mode: Some(0o440),
                    uid: Some(101),
                    gid: Some(101),
                },
                ConfigFile {
                    name: "motd".into(),
                    target: "/motd".into(),
                    content: "hello alice".into(),
                    mode: None,
                    uid: None,
                    gid: None,
                },
            ],
            secrets: Vec::new(),
        },
        ports: vec![
            PortSpec::Ingress {
                hostname: None,
                published: None,
                container_port: 9090,
                protocol: IngressProtocol::Http,
            },
            PortSpec::Ingress {
                hostname: Some("shop.example.com".into()),
                published: None,
                container_port: 8080,
                protocol: IngressProtocol::Https,
            },
            PortSpec::Host {
                host_ip: None,
                host_port: Some(8443),
                container_port: 443,
                protocol: HostProtocol::Tcp,
            },
        ],
        machines: vec!["m1".parse().unwrap(), "m2".parse().unwrap()],
        update: UpdateConfig {
            order: Some(UpdateOrder::StartFirst),
            monitor_ms: Some(10_000),
        },
        pre_deploy: Some(PreDeployHook {
            command: s(&["./migrate", "up"]),
            env: map(&[("MIGRATE", "1")]),
            privileged: false,
            user: None,
            timeout_ms: 120_000,
        }),
        depends_on: vec!["db".parse().unwrap()],
        revisions: Some(12),
        routes: vec![
            RouteSpec {
                hostname: "shop.example.com".into(),
                path: PathMatch::Prefix("/".into()),
                strip_prefix: false,
                redirect: None,
                request_headers: Default::default(),
                response_headers: Default::default(),
                allow: vec![],
                ..Default::default()
            },
            RouteSpec {
                hostname: "shop.example.com".into(),
                path: PathMatch::Prefix("/api".into()),
                strip_prefix: true,
                redirect: None,
                request_headers: Default::default(),
                response_headers: Default::default(),
                allow: vec![],
                ..Default::default()
            },
            RouteSpec {
                hostname: "shop.example.com".into(),
                path: PathMatch::Exact("/healthz".into()),
                strip_prefix: false,
                redirect: None,
                request_headers: Default::default(),
                response_headers: Default::default(),
                allow: vec![],
                ..Default::default()
            },
        ],
    }
}

#[test]
fn a_full_featured_file_produces_the_exact_spec() {
    let dir = project(&[
        ("compose.yaml", FULL),
        (
            "web.env",
            "# web settings\nPORT=3000\nSECRET=\"s3cr3t # not a comment\" # a comment\n",
        ),
        ("conf/nginx.conf", "worker_processes 1;\n"),
    ]);
    let p = load(&input(
        dir.path(),
        &["compose.yaml"],
        &[("FROM_ENV", "from the shell"), ("USER_NAME", "alice")],
        &[],
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(names(&p), ["db", "web"]);
    assert_eq!(service(&p, "web"), &full_web_spec());
    assert_eq!(
        service(&p, "db"),
        &ServiceSpec {
            name: "db".parse().unwrap(),
            mode: ServiceMode::Replicated,
            replicas: 1,
            container: ContainerSpec {
                image: "postgres:16".into(),
                mounts: vec![Mount::Volume {
                    source: "db".into(),
                    target: "/var/lib/postgresql/data".into(),
                    read_only: false,
                    no_copy: false,
                }],
                ..Default::default()
            },
            ports: vec![],
            machines: vec![],
            update: UpdateConfig::default(),
            pre_deploy: None,
            depends_on: vec![],
            revisions: None,
            routes: vec![],
        }
    );
    assert_eq!(
        p.volumes,
        vec![
            VolumeSpec {
                name: "db".into(),
                driver: None,
                driver_opts: BTreeMap::new(),
                labels: BTreeMap::new(),
                external: false,
            },
            VolumeSpec {
                name: "shop-data".into(),
                driver: None,
                driver_opts: BTreeMap::new(),
                labels: [("team".to_string(), "shop".to_string())].into(),
                external: false,
            },
        ]
    );
    let keys: Vec<&str> = p.warnings.iter().map(|w| w.key.as_str()).collect();
    // name and version are top-level keys Ployz has no use for.
    assert_eq!(keys, ["name", "version", "cap_add"], "{:#?}", p.warnings);
    assert_eq!(
        p.warnings[2].to_string(),
        format!(
            "{}: service 'web': cap_add: adds Linux capabilities to the container: NET_ADMIN, SYS_PTRACE",
            dir.path().join("compose.yaml").display()
        )
    );
}

// ---- merging, interpolation, profiles, order ----------------------------------------------

#[test]
fn later_files_override_earlier_ones() {
    let dir = project(&[
        (
            "compose.yaml",
            r#"
services:
  api:
    image: api:1
    environment: [A=1, B=2]
    x-ports: ["api.example.com:8080"]
    labels: { team: core }
    deploy:
      replicas: 2
      resources: { limits: { memory: 1g } }
  worker:
    image: worker:1
    command: [work, --fast]
"#,
        ),
        (
            "prod.yaml",
            r#"
services:
  api:
    image: api:2
    environment: { B: "3", C: "4" }
    x-ports: ["admin.example.com:9090"]
    labels: !reset {}
    deploy:
      replicas: 5
  worker:
    command: !reset null
  extra:
    image: extra:1
"#,
        ),
    ]);
    let p = load(&input(dir.path(), &["compose.yaml", "prod.yaml"], &[], &[]))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(names(&p), ["api", "extra", "worker"]);
    let api = service(&p, "api");
    assert_eq!(api.container.image, "api:2");
    assert_eq!(
        api.container.env,
        [("A", "1"), ("B", "3"), ("C", "4")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect::<BTreeMap<_, _>>()
    );
    assert_eq!(
        api.ports.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        ["admin.example.com:9090/https", "api.example.com:8080/https"],
        "a later file's ports are added to the earlier file's, as Compose merges lists"
    );
    assert_eq!(api.replicas, 5);
    assert_eq!(api.container.resources.memory_limit_bytes, Some(1 << 30));
    let worker = service(&p, "worker");
    assert_eq!(worker.container.image, "worker:1");
    assert_eq!(worker.container.command, None);
    assert!(p.warnings.is_empty(), "{:#?}", p.warnings);
}

#[test]
fn variables_come_from_the_environment_then_dot_env() {
    let dir = project(&[
        (
            "compose.yaml",
            r#"
services:
  web:
    image: "nginx:${TAG}"
    command: ["echo", "$$HOME", "${MISSING}", "${UNSET:-fallback}", "$PORT", "cost: $$5"]
    environment:
      FROM_DOTENV: ${FROM_DOTENV}
      BARE:
    deploy:
      replicas: ${REPLICAS:-2}
"#,
        ),
        (
            ".env",
            "TAG=1.0\nPORT=80\nFROM_DOTENV=dotenv\nBARE=from-dotenv\n",
        ),
    ]);
    let p = load(&input(
        dir.path(),
        &["compose.yaml"],
        &[("TAG", "2.0")],
        &[],
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let web = service(&p, "web");
    assert_eq!(web.container.image, "nginx:2.0");
    assert_eq!(
        web.container.command.as_deref().unwrap(),
        ["echo", "$HOME", "", "fallback", "80", "cost: $5"]
    );
    assert_eq!(web.container.env["FROM_DOTENV"], "dotenv");
    assert_eq!(web.container.env["BARE"], "from-dotenv");
    assert_eq!(web.replicas, 2);
    assert_eq!(p.warnings.len(), 1, "{:#?}", p.warnings);
    assert!(p.warnings[0]
        .message
        .contains("variable 'MISSING' is not set"));
    assert_eq!(p.warnings[0].key, "command[2]");
    assert_eq!(p.warnings[0].service.as_deref(), Some("web"));
}

#[test]
fn a_variable_left_unset_is_left_out_with_a_warning() {
    let p = ok("services:\n  web:\n    image: nginx\n    environment: [SET=1, NOT_SET]\n");
    let web = service(&p, "web");
    assert_eq!(web.container.env.len(), 1);
    assert_eq!(web.container.env["SET"], "1");
    assert!(warning(&p, "environment.NOT_SET")
        .message
        .contains("'NOT_SET' has no value"));
}

#[test]
fn profiles_select_services() {
    let yaml = r#"
services:
  web: { image: nginx }
  debug: { image: busybox, profiles: [debug] }
  admin: { image: adminer, profiles: [tools, debug] }
"#;
    let dir = project(&[("compose.yaml", yaml)]);
    let with = |profiles: &[&str]| {
        let p = load(&input(dir.path(), &["compose.yaml"], &[], profiles)).unwrap();
        names(&p).into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    assert_eq!(with(&[]), ["web"]);
    assert_eq!(with(&["debug"]), ["admin", "debug", "web"]);
    assert_eq!(with(&["tools"]), ["admin", "web"]);
    assert_eq!(with(&["*"]), ["admin", "debug", "web"]);
    assert_eq!(with(&["nope"]), ["web"]);
}

#[test]
fn services_come_in_dependency_order_ties_by_name() {
    let p = ok(r#"
services:
  web: { image: w, depends_on: [api, cache, cache] }
  api: { image: a, depends_on: { db: { condition: service_started } } }
  db: { image: d }
  cache: { image: c }
  zeta: { image: z }
"#);
    assert_eq!(names(&p), ["cache", "db", "api", "web", "zeta"]);
    let deps: Vec<&str> = service(&p, "web")
        .depends_on
        .iter()
        .map(|d| d.as_str())
        .collect();
    assert_eq!(deps, ["api", "cache"]);
}

// ---- warnings -----------------------------------------------------------------------------

#[test]
fn unsupported_unknown_and_privileged_settings_warn() {
    let p = ok(r#"
services:
  web:
    image: nginx
    imagee: typo
    dns: 8.8.8.8
    restart: on-failure:3
    container_name: my-web
    privileged: true
    cap_add: [NET_ADMIN]
    volumes:
      - /var/run/docker.sock:/var/run/docker.sock
      - /:/host:ro
    devices: ["/dev/fuse"]
    networks: [default, backend]
    x-port: ["app.example.com:80"]
    depends_on:
      migrate: { condition: service_completed_successfully }
    deploy:
      placement: { constraints: [node.role==manager] }
      restart_policy: { condition: on-failure }
  migrate: { image: m }
"#);
    let cases = [
        ("imagee", "unknown key, ignored; did you mean 'image'?"),
        ("dns", "not supported"),
        ("restart", "'on-failure:3' is not what Ployz does"),
        ("container_name", "generated"),
        ("privileged", "full control of its Machine"),
        ("cap_add", "NET_ADMIN"),
        ("volumes[0]", "Docker socket"),
        ("volumes[1]", "root filesystem"),
        ("devices", "/dev/fuse"),
        ("networks", "backend"),
        ("x-port", "did you mean 'x-ports'?"),
        ("depends_on.migrate.condition", "x-pre_deploy"),
        ("deploy.placement", "x-machines"),
        ("deploy.restart_policy", "unless-stopped"),
    ];
    for (key, want) in cases {
        let w = warning(&p, key);
        assert!(w.message.contains(want), "{key}: {}", w.message);
        assert_eq!(w.service.as_deref(), Some("web"));
    }
    assert_eq!(p.warnings.len(), cases.len(), "{:#?}", p.warnings);
    let web = service(&p, "web");
    assert!(web.container.privileged);
    assert_eq!(web.container.cap_add, ["NET_ADMIN"]);
    assert_eq!(web.container.mounts.len(), 2);
}

#[test]
fn volume_declarations_convert_and_warn_about_disguised_binds() {
    let p = ok(r#"
services:
  app:
    image: app
    volumes:
      - type: volume
        source: cache
        target: /cache
        read_only: true
        volume: { nocopy: true }
      - shared:/shared:nocopy
      - outside:/outside
volumes:
  cache:
    driver: local
    driver_opts: { type: none, o: bind, device: /srv/cache }
  shared:
    external: true
    name: team-shared
  outside:
    external: true
"#);
    assert_eq!(
        p.volumes,
        vec![
            VolumeSpec {
                name: "cache".into(),
                driver: Some("local".into()),
                driver_opts: [("device", "/srv/cache"), ("o", "bind"), ("type", "none")]
                    .iter()
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect(),
                labels: BTreeMap::new(),
                external: false,
            },
            VolumeSpec {
                name: "outside".into(),
                driver: None,
                driver_opts: BTreeMap::new(),
                labels: BTreeMap::new(),
                external: true,
            },
            VolumeSpec {
                name: "team-shared".into(),
                driver: None,
                driver_opts: BTreeMap::new(),
                labels: BTreeMap::new(),
                external: true,
            },
        ]
    );
    assert_eq!(
        service(&p, "app").container.mounts,
        vec![
            Mount::Volume {
                source: "cache".into(),
                target: "/cache".into(),
                read_only: true,
                no_copy: true
            },
            Mount::Volume {
                source: "outside".into(),
                target: "/outside".into(),
                read_only: false,
                no_copy: false
            },
            Mount::Volume {
                source: "team-shared".into(),
                target: "/shared".into(),
                read_only: false,
                no_copy: true
            },
        ]
    );
    let w = warning(&p, "volumes.cache.driver_opts");
    assert!(w.message.contains("/srv/cache"), "{}", w.message);
    assert!(
        w.message.contains("Bind Mount in disguise"),
        "{}",
        w.message
    );
    assert_eq!(w.service, None);
}

// ---- forms and normalisation --------------------------------------------------------------

#[test]
fn healthcheck_forms() {
    let p = ok(r#"
services:
  a: { image: x, healthcheck: { test: [CMD, pg_isready] } }
  b: { image: x, healthcheck: { test: [NONE] } }
  c: { image: x, healthcheck: { disable: true } }
  d: { image: x }
"#);
    let hc = |n: &str| service(&p, n).container.healthcheck.clone();
    assert_eq!(
        hc("a"),
        Some(Healthcheck::Configured(
            ConfiguredHealthcheck::new(vec!["CMD".into(), "pg_isready".into()]).unwrap()
        ))
    );
    assert_eq!(hc("b"), Some(Healthcheck::Disabled));
    assert_eq!(hc("c"), Some(Healthcheck::Disabled));
    assert_eq!(hc("d"), None);
}

#[test]
fn entrypoint_and_command_forms() {
    let p = ok(r#"
services:
  a: { image: x, entrypoint: "", command: "sh -c 'echo hi && sleep 1'" }
  b: { image: x, entrypoint: [], command: [sleep, 10] }
  c: { image: x, entrypoint: /bin/sh }
"#);
    let a = &service(&p, "a").container;
    assert_eq!(a.entrypoint, Some(vec![]));
    assert_eq!(
        a.command.as_deref().unwrap(),
        ["sh", "-c", "echo hi && sleep 1"]
    );
    let b = &service(&p, "b").container;
    assert_eq!(b.entrypoint, Some(vec![]));
    assert_eq!(b.command.as_deref().unwrap(), ["sleep", "10"]);
    assert_eq!(
        service(&p, "c").container.entrypoint.as_deref().unwrap(),
        ["/bin/sh"]
    );
}

#[test]
fn host_mode_ports_in_the_long_syntax() {
    let p = ok(r#"
services:
  dns:
    image: coredns
    scale: 2
    ports:
      - target: 53
        published: 5353
        protocol: udp
        mode: host
        host_ip: 127.0.0.1
      - { target: 80, published: "8080", mode: host }
      - { target: 443, published: 8443, mode: host, host_ip: "::1" }
"#);
    let dns = service(&p, "dns");
    assert_eq!(dns.replicas, 2);
    assert_eq!(
        dns.ports,
        vec![
            PortSpec::Host {
                host_ip: None,
                host_port: Some(8080),
                container_port: 80,
                protocol: HostProtocol::Tcp,
            },
            PortSpec::Host {
                host_ip: Some("127.0.0.1".into()),
                host_port: Some(5353),
                container_port: 53,
                protocol: HostProtocol::Udp,
            },
            PortSpec::Host {
                host_ip: Some("::1".into()),
                host_port: Some(8443),
                container_port: 443,
                protocol: HostProtocol::Tcp,
            },
        ]
    );
}

/// A host port on the Machine, for the expectations below.
fn host(ip: Option<&str>, host_port: Option<u16>, container_port: u16, udp: bool) -> PortSpec {
    PortSpec::Host {
        host_ip: ip.map(str::to_owned),
        host_port,
        container_port,
        protocol: if udp {
            HostProtocol::Udp
        } else {
            HostProtocol::Tcp
        },
    }
}

#[test]
fn short_syntax_ports_bind_on_the_machine() {
    let cases: &[(&str, Vec<PortSpec>)] = &[
        ("\"80:80\"", vec![host(None, Some(80), 80, false)]),
        ("\"3000\"", vec![host(None, None, 3000, false)]),
        ("3000", vec![host(None, None, 3000, false)]),
        ("8080:80", vec![host(None, Some(8080), 80, false)]),
        (
            "\"127.0.0.1:8080:80\"",
            vec![host(Some("127.0.0.1"), Some(8080), 80, false)],
        ),
        (
            "\"[::1]:8080:80\"",
            vec![host(Some("::1"), Some(8080), 80, false)],
        ),
        (
            "\"::1:8080:80\"",
            vec![host(Some("::1"), Some(8080), 80, false)],
        ),
        ("\"53:53/udp\"", vec![host(None, Some(53), 53, true)]),
        ("\"53:53/UDP\"", vec![host(None, Some(53), 53, true)]),
        ("\"8080:80/tcp\"", vec![host(None, Some(8080), 80, false)]),
        (
            "\"127.0.0.1::80\"",
            vec![host(Some("127.0.0.1"), None, 80, false)],
        ),
        (
            "\"8000-8002:9000-9002\"",
            vec![
                host(None, Some(8000), 9000, false),
                host(None, Some(8001), 9001, false),
                host(None, Some(8002), 9002, false),
            ],
        ),
        (
            "\"8000-8001\"",
            vec![host(None, None, 8000, false), host(None, None, 8001, false)],
        ),
        (
            "\"10000-10001:10000-10001/udp\"",
            vec![
                host(None, Some(10000), 10000, true),
                host(None, Some(10001), 10001, true),
            ],
        ),
        ("\"8000-8000:80\"", vec![host(None, Some(8000), 80, false)]),
    ];
    for (entry, want) in cases {
        let p = ok(&format!(
            "services:\n  web:\n    image: nginx\n    ports:\n      - {entry}\n"
        ));
        assert_eq!(&service(&p, "web").ports, want, "{entry}");
        assert!(p.warnings.is_empty(), "{entry}: {:?}", p.warnings);
    }
}

#[test]
fn long_syntax_ports_without_mode_bind_on_the_machine() {
    let p = ok(r#"
services:
  web:
    image: nginx
    ports:
      - target: 80
        published: 8080
      - target: 443
        published: "8443"
        mode: ingress
        host_ip: 127.0.0.1
      - target: 3000
      - target: 9000
        published: 9000-9000
        protocol: udp
"#);
    assert_eq!(
        service(&p, "web").ports,
        vec![
            host(None, None, 3000, false),
            host(None, Some(8080), 80, false),
            host(None, Some(9000), 9000, true),
            host(Some("127.0.0.1"), Some(8443), 443, false),
        ]
    );
}

#[test]
fn ports_and_x_ports_together_are_merged() {
    let p = ok(r#"
services:
  web:
    image: nginx
    ports: ["8080:80", "3000"]
    x-ports: ["app.example.com:80", "9090:90/udp@host", "4000/tcp@host"]
"#);
    assert_eq!(
        service(&p, "web").ports,
        vec![
            PortSpec::Ingress {
                hostname: Some("app.example.com".into()),
                published: None,
                container_port: 80,
                protocol: IngressProtocol::Https,
            },
            host(None, None, 3000, false),
            host(None, None, 4000, false),
            host(None, Some(8080), 80, false),
            host(None, Some(9090), 90, true),
        ]
    );
}

#[test]
fn equal_configurations_written_differently_compare_equal() {
    let one = ok(r#"
services:
  web:
    image: nginx
    environment: { B: "2", A: "1" }
    cap_add: [NET_ADMIN, CHOWN]
    x-ports: ["b.example.com:80", "a.example.com:80/https", "a.example.com:80"]
    x-machines: [m2, m1]
    volumes: ["/srv/b:/b", "/srv/a:/a/"]
    sysctls: { net.ipv4.ip_forward: 1 }
"#);
    let two = ok(r#"
services:
  web:
    image: nginx
    environment: [A=1, B=2]
    cap_add: [CHOWN, NET_ADMIN, CHOWN]
    x-ports: ["A.EXAMPLE.COM:80/https", "b.example.com:80/https"]
    x-machines: "m1,m2"
    volumes:
      - { type: bind, source: /srv/a/, target: /a }
      - { type: bind, source: /srv/b, target: /b }
    sysctls: ["net.ipv4.ip_forward=1"]
"#);
    assert_eq!(service(&one, "web"), service(&two, "web"));
    assert_eq!(
        service(&one, "web")
            .ports
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>(),
        ["a.example.com:80/https", "b.example.com:80/https"]
    );
}

#[test]
fn yaml_anchors_and_merge_keys_work() {
    let p = ok(r#"
x-base: &base
  image: nginx:1.27
  environment: { A: "1" }
  deploy: { replicas: 2 }
services:
  web:
    <<: *base
    environment: { B: "2" }
  api: *base
"#);
    let web = service(&p, "web");
    assert_eq!(web.container.image, "nginx:1.27");
    assert_eq!(web.replicas, 2);
    assert_eq!(
        web.container.env.keys().collect::<Vec<_>>(),
        ["B"],
        "merge keys are shallow, as in YAML"
    );
    assert_eq!(
        service(&p, "api").container.env.keys().collect::<Vec<_>>(),
        ["A"]
    );
}

#[test]
fn x_pre_deploy_defaults_and_x_machines_forms() {
    let p = ok(r#"
services:
  web:
    image: nginx
    x-machines: [m1]
    x-pre_deploy:
      command: [./migrate, up]
      environment: { A: "1" }
      privileged: true
      user: root
  api:
    image: api
    x-machines: m3
"#);
    let web = service(&p, "web");
    assert_eq!(
        web.pre_deploy,
        Some(PreDeployHook {
            command: vec!["./migrate".into(), "up".into()],
            env: [("A".to_string(), "1".to_string())].into(),
            privileged: true,
            user: Some("root".into()),
            timeout_ms: 300_000,
        })
    );
    assert_eq!(web.machines, vec!["m1".parse().unwrap()]);
    assert_eq!(service(&p, "api").machines, vec!["m3".parse().unwrap()]);
    assert!(warning(&p, "x-pre_deploy.privileged")
        .message
        .contains("privileged"));
}

#[test]
fn update_config_without_monitor_keeps_the_default() {
    let p = ok("services:\n  web:\n    image: nginx\n    deploy:\n      update_config:\n        order: stop-first\n");
    assert_eq!(
        service(&p, "web").update,
        UpdateConfig {
            order: Some(UpdateOrder::StopFirst),
            monitor_ms: None
        }
    );
}

#[test]
fn parse_port_is_usable_alone() {
    let svc = "web".parse().unwrap();
    assert_eq!(
        parse_port("app.example.com:8080", &svc)
            .unwrap()
            .to_string(),
        "app.example.com:8080/https"
    );
    assert!(parse_port("8080", &svc).unwrap_err().contains("8080/https"));
}

#[test]
fn odd_inputs_never_panic_and_errors_stay_one_line() {
    let inputs = [
        "[]",
        "42",
        "services: 5",
        "services: {}",
        "services: {web: 5}",
        "services: {web: null}",
        "services: {web: {image: [1]}}",
        "services: {web: {image: x, ports: {a: 1}}}",
        "services: {web: {image: x, ports: [[1]]}}",
        "services: {web: {image: x, x-ports: [\"\\u0000\"]}}",
        "services: {web: {image: x, x-ports: \"80/http\"}}",
        "services: {web: {image: x, volumes: [{type: volume}]}}",
        "services: {web: {image: x, volumes: [\"a:b:c:d\"]}}",
        "services: {web: {image: x, volumes: [\"/data\"]}}",
        "services: {web: {image: x, healthcheck: {test: []}}}",
        "services: {web: {image: x, healthcheck: {test: [CMD]}}}",
        "services: {web: {image: x, healthcheck: {test: {a: 1}}}}",
        "services: {web: {image: x, ulimits: {a: {soft: 5}}}}",
        "services: {web: {image: x, ulimits: {a: {soft: 9, hard: 5}}}}",
        "services: {web: {image: x, deploy: []}}",
        "services: {web: {image: x, deploy: {resources: {limits: {cpus: -1}}}}}",
        "services: {web: {image: x, cpus: .nan}}",
        "services: {web: {image: x, shm_size: 99999999999999999999999}}",
        "services: {web: {image: x, environment: [[1]]}}",
        "services: {web: {image: x, command: \"echo 'unterminated\"}}",
        "services: {web: {image: x, configs: [{target: /x}]}}",
        "services: {web: {image: x, depends_on: 5}}",
        "services: {web: {image: x, x-machines: {a: 1}}}",
        "services: {web: {image: x, x-pre_deploy: 1}}",
        "services: {web: {image: x, env_file: [{required: false}]}}",
        "services: {\"\": {image: x}}",
        "services: {web: {image: \"${\"}}",
        "services: {web: {image: \"${A:-${B:-${C}}}\"}}",
        "volumes: {v: 1}\nservices: {web: {image: x}}",
        "x: &a [*a]",
        "? [a]\n: b",
        "services: {web: {image: x, <<: 5}}",
        "services:\n  web:\n    image: x\n---\nservices: {}",
        "\u{feff}services: {web: {image: x}}",
        "services: {ünï: {image: x}}",
        "services: {web: {image: x, tmpfs: [\"/run:size=abc\"]}}",
        "services: {web: {image: x, logging: {options: {a: 1}}}}",
    ];
    let mut laughs = String::from("x-a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    let mut prev = "a".to_string();
    for n in ["b", "c", "d", "e", "f", "g", "h", "i"] {
        laughs.push_str(&format!("x-{n}: &{n} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"));
        prev = n.to_string();
    }
    laughs.push_str("services: {web: {image: x}}\n");
    let laughs_err = load_yaml(&laughs).unwrap_err().to_string();
    assert!(laughs_err.contains("repetition limit"), "{laughs_err}");
    for yaml in inputs {
        match load_yaml(yaml) {
            Ok(_) => {}
            Err(e) => {
                assert!(!e.0.is_empty(), "{yaml}: an error result holds errors");
                for err in &e.0 {
                    assert_eq!(err.to_string().lines().count(), 1, "{yaml}: {err}");
                }
            }
        }
    }
}

#[test]
fn yaml_1_1_booleans_are_read_as_compose_reads_them() {
    let p = ok("services:\n  a:\n    image: nginx\n    init: yes\n    healthcheck:\n      disable: On\n  b:\n    image: nginx\n    init: off\n");
    assert_eq!(service(&p, "a").container.init, Some(true));
    assert_eq!(
        service(&p, "a").container.healthcheck,
        Some(ployz_core::Healthcheck::Disabled),
        "disable: On"
    );
    assert_eq!(service(&p, "b").container.init, Some(false));
    let e = load_yaml("services:\n  a:\n    image: nginx\n    init: maybe\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("init") && e.contains("yes/no"), "{e}");
}
