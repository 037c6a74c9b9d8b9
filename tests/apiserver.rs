//! The test API server through kube-rs, unmodified: discovery and the write verbs tests use.

mod support;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::Discovery;
use kube::{Api, Client};
use support::{Cluster, service};

async fn client(cluster: &Cluster) -> Client {
    kube_proxy_rs::k8s::build_client(Some(&cluster.kubeconfig), None, None)
        .await
        .expect("client")
}

#[tokio::test]
async fn discovery_lists_the_served_kinds() {
    let cluster = Cluster::start().await;
    let discovery = Discovery::new(client(&cluster).await)
        .run()
        .await
        .expect("discovery");
    let mut kinds: Vec<String> = discovery
        .groups()
        .flat_map(|group| group.recommended_resources())
        .map(|(resource, _)| format!("{}/{}", resource.api_version, resource.kind))
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        vec![
            "discovery.k8s.io/v1/EndpointSlice",
            "events.k8s.io/v1/Event",
            "networking.k8s.io/v1/ServiceCIDR",
            "v1/ConfigMap",
            "v1/Event",
            "v1/Node",
            "v1/Service"
        ]
    );
}

#[tokio::test]
async fn create_replace_patch_delete() {
    let cluster = Cluster::start().await;
    let client = client(&cluster).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "shop");
    let svc: Service = serde_json::from_value(service("shop", "cart", "10.96.1.1", &[80])).unwrap();
    let created = services
        .create(&PostParams::default(), &svc)
        .await
        .expect("create");
    assert!(created.metadata.resource_version.is_some());
    assert!(
        services.create(&PostParams::default(), &svc).await.is_err(),
        "409 on a second create"
    );

    let patch = serde_json::json!({"metadata": {"labels": {"tier": "front"}}});
    let patched = services
        .patch("cart", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch");
    assert_eq!(patched.metadata.labels.unwrap()["tier"], "front");

    let mut replaced = services.get("cart").await.expect("get");
    replaced.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81;
    let replaced = services
        .replace("cart", &PostParams::default(), &replaced)
        .await
        .expect("replace");
    assert_eq!(replaced.spec.unwrap().ports.unwrap()[0].port, 81);

    let labelled = services
        .list(&ListParams::default().labels("tier=front"))
        .await
        .expect("list");
    assert_eq!(labelled.items.len(), 1);
    let none = services
        .list(&ListParams::default().labels("tier!=front"))
        .await
        .expect("list");
    assert!(none.items.is_empty());

    services
        .delete("cart", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(services.get_opt("cart").await.expect("get_opt").is_none());

    let maps: Api<ConfigMap> = Api::namespaced(client, "kube-system");
    let map: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kube-proxy"}, "data": {"config.conf": "mode: ipvs\n"}
    }))
    .unwrap();
    maps.create(&PostParams::default(), &map)
        .await
        .expect("create configmap");
    assert_eq!(
        maps.get("kube-proxy").await.unwrap().data.unwrap()["config.conf"],
        "mode: ipvs\n"
    );
}

#[test]
fn objects_load_from_lists_and_streams() {
    let list = include_str!("testdata/cluster.yaml");
    assert_eq!(test_apiserver::objects_from_yaml(list).unwrap().len(), 9);
    let stream = "kind: Service\nmetadata: {name: a}\n---\nkind: Node\nmetadata: {name: b}\n";
    assert_eq!(test_apiserver::objects_from_yaml(stream).unwrap().len(), 2);
    assert!(test_apiserver::objects_from_yaml("- 1\n").is_err());
}

/// Pages of a list: each page's `continue` leads to the next one and the pages together hold
/// every object once; `remainingItemCount` comes only without a selector, as upstream.
#[tokio::test]
async fn list_pages_follow_their_continue_tokens() {
    let cluster = Cluster::start().await;
    for i in 0..7u32 {
        cluster
            .server
            .apply(service(
                "paged",
                &format!("svc-{i}"),
                &format!("10.96.9.{}", i + 1),
                &[80],
            ))
            .unwrap();
    }
    let services: Api<Service> = Api::namespaced(client(&cluster).await, "paged");
    for (selector, counted) in [
        (None, true),
        (Some("!service.kubernetes.io/headless"), false),
    ] {
        let mut names = Vec::new();
        let mut token: Option<String> = None;
        let mut pages = 0;
        loop {
            let mut params = ListParams::default().limit(3);
            if let Some(selector) = selector {
                params = params.labels(selector);
            }
            if let Some(token) = &token {
                params = params.continue_token(token);
            }
            let page = services.list(&params).await.expect("page");
            pages += 1;
            names.extend(page.items.iter().filter_map(|s| s.metadata.name.clone()));
            let remaining = page.metadata.remaining_item_count;
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            match &token {
                Some(_) => assert_eq!(remaining.is_some(), counted, "{selector:?}"),
                None => break,
            }
            if counted {
                assert_eq!(remaining, Some(7 - names.len() as i64));
            }
        }
        assert_eq!(pages, 3, "{selector:?}");
        let expected: Vec<String> = (0..7).map(|i| format!("svc-{i}")).collect();
        assert_eq!(names, expected, "{selector:?}");
    }
}
