use super::*;
use crate::model::{NodeInfo, ProxyState};
use crate::proxier::fixtures::{NODE, Svc, ep, svc};

fn context() -> IpvsContext {
    crate::proxier::ipvs::render::tests::context(crate::model::IpFamily::V4)
}

fn put(state: &mut ProxyState, s: Svc) {
    state.services.insert(s.key.clone(), s.ports);
    state.endpoints.insert(s.key, s.endpoints);
}

fn services() -> Vec<Svc> {
    vec![
        svc("ns", "a", "10.96.0.1", |p| p.node_port = Some(30001)).with_endpoints(vec![
            ep("10.244.0.5", 8080, NODE),
            ep("10.244.1.5", 8080, "b"),
        ]),
        // b and c share an external IP (different ports): the address stays bound for either.
        svc("ns", "b", "10.96.0.2", |p| {
            p.external_ips = vec!["192.168.99.1".parse().unwrap()]
        })
        .with_endpoints(vec![ep("10.244.1.6", 8080, "b")]),
        svc("ns", "c", "10.96.0.3", |p| {
            p.port = 81;
            p.external_ips = vec!["192.168.99.1".parse().unwrap()];
        })
        .with_endpoints(vec![ep("10.244.0.6", 8080, NODE)]),
    ]
}

/// Restricts a whole desired state to what `touched` names, as `desired_part` should.
fn restricted(whole: &DesiredIpvs, touched: &Touched) -> DesiredIpvs {
    DesiredIpvs {
        services: whole
            .services
            .iter()
            .filter(|(k, _)| touched.services.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        bound: whole.bound.intersection(&touched.bound).copied().collect(),
        sets: whole
            .sets
            .iter()
            .map(|(spec, entries)| {
                let kept = entries
                    .iter()
                    .filter(|e| {
                        touched
                            .entries
                            .iter()
                            .any(|(b, t)| set_name(b, spec.family) == spec.name && t == *e)
                    })
                    .cloned()
                    .collect();
                (spec.clone(), kept)
            })
            .collect(),
        iptables: whole.iptables.clone(),
    }
}

type Step = Box<dyn Fn(&mut ProxyState)>;

#[test]
fn rerendering_changed_services_equals_a_full_render() {
    let ctx = context();
    let mut state = ProxyState {
        node: NodeInfo {
            name: NODE.into(),
            ..NodeInfo::default()
        },
        ..ProxyState::default()
    };
    services().into_iter().for_each(|s| put(&mut state, s));
    let mut aggregate = Aggregate::build(&state, &ctx);
    assert_eq!(
        aggregate.desired(&ctx),
        Aggregate::build(&state, &ctx).desired(&ctx)
    );

    let b = NamespacedName::new("ns", "b");
    let a = NamespacedName::new("ns", "a");
    let steps: Vec<(NamespacedName, Step)> = vec![
        // b goes: its external IP stays bound (c needs it), its cluster IP does not.
        (
            b.clone(),
            Box::new(|s: &mut ProxyState| {
                s.services.remove(&NamespacedName::new("ns", "b"));
                s.endpoints.remove(&NamespacedName::new("ns", "b"));
            }),
        ),
        // a loses its local endpoint: its KUBE-LOOP-BACK entry goes.
        (
            a.clone(),
            Box::new(|s: &mut ProxyState| {
                s.endpoints
                    .get_mut(&NamespacedName::new("ns", "a"))
                    .unwrap()
                    .values_mut()
                    .next()
                    .unwrap()
                    .remove(0);
            }),
        ),
        // b comes back with a node port.
        (
            b.clone(),
            Box::new(|s: &mut ProxyState| {
                put(
                    s,
                    svc("ns", "b", "10.96.0.2", |p| p.node_port = Some(30002)),
                );
            }),
        ),
    ];
    for (key, step) in steps {
        let before = aggregate.desired(&ctx);
        step(&mut state);
        let touched = aggregate.rerender(&key, &state, &ctx);
        let whole = Aggregate::build(&state, &ctx).desired(&ctx);
        assert_eq!(aggregate.desired(&ctx), whole, "after re-rendering {key}");
        assert_eq!(
            aggregate.desired_part(&ctx, &touched),
            restricted(&whole, &touched)
        );
        // Nothing outside the touched pieces changed.
        let untouched = |d: &DesiredIpvs| {
            d.services
                .keys()
                .filter(|k| !touched.services.contains(*k))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(untouched(&before), untouched(&whole));
    }
    let whole = aggregate.desired(&ctx);
    assert!(whole.bound.contains(&"192.168.99.1".parse().unwrap()));
    assert!(whole.bound.contains(&"10.96.0.2".parse().unwrap()));
    let loop_back = &whole
        .sets
        .iter()
        .find(|(s, _)| s.name == "KUBE-LOOP-BACK")
        .unwrap()
        .1;
    assert_eq!(
        loop_back.iter().collect::<Vec<_>>(),
        vec!["10.244.0.6,tcp:8080,10.244.0.6"],
        "only c's local endpoint is left"
    );
}

#[test]
fn removing_the_last_service_empties_everything() {
    let ctx = context();
    let mut state = ProxyState::default();
    let s = services().remove(0);
    let key = s.key.clone();
    put(&mut state, s);
    let mut aggregate = Aggregate::build(&state, &ctx);
    state.services.clear();
    state.endpoints.clear();
    let touched = aggregate.rerender(&key, &state, &ctx);
    assert_eq!(aggregate.desired(&ctx), Aggregate::default().desired(&ctx));
    assert!(touched.services.contains("10.96.0.1:80/TCP"));
    assert!(aggregate.desired_part(&ctx, &touched).services.is_empty());
}
