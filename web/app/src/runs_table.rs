//! The runs table (W&B's runs view, TensorBoard's hparams): every run of the folder with
//! where it ended (last loss, last evaluation, peak memory) and the config keys whose
//! values differ between runs, from `/api/hparams`; a run's name opens it.
//!
//! May call: `state`, `wgtrain_record`, leptos. Called by: the app.

use std::collections::BTreeSet;

use leptos::prelude::*;
use wgtrain_record::{HparamsRow, format_bytes};

use crate::state::{Ctx, encode, get_json, token_query};

/// The runs table (see the module).
#[component]
pub fn RunsTable(ctx: Ctx) -> impl IntoView {
    let rows = RwSignal::new(None::<Result<Vec<HparamsRow>, String>>);
    Effect::new(move |_| {
        // Again when the runs listed change or the shown run finishes (not at every live
        // step: each fetch reads every run's log).
        let _ = ctx.runs.get();
        let _ = ctx.run.with(|r| r.finished);
        leptos::task::spawn_local(async move {
            rows.set(Some(get_json::<Vec<HparamsRow>>(&format!("/api/hparams{}", token_query(true))).await));
        });
    });
    let body = move || match rows.get() {
        None => view! { <p class="empty">"loading..."</p> }.into_any(),
        Some(Err(e)) => view! { <p class="empty">{e}</p> }.into_any(),
        Some(Ok(r)) if r.is_empty() => view! { <p class="empty">"no runs"</p> }.into_any(),
        Some(Ok(r)) => {
            // The keys whose values are not the same in every run.
            let keys: Vec<String> = r
                .iter()
                .flat_map(|row| row.config.keys().cloned())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .filter(|k| r.iter().any(|row| row.config.get(k) != r[0].config.get(k)))
                .collect();
            let num = |v: Option<f64>, digits: usize| v.map_or(String::new(), |x| format!("{x:.digits$}"));
            let head = keys.iter().map(|k| view! { <th>{k.clone()}</th> }).collect_view();
            let body = r
                .iter()
                .map(|row| {
                    let href = format!("?run={}{}", encode(&row.name), token_query(false));
                    let cells = keys
                        .iter()
                        .map(|k| view! { <td>{row.config.get(k).cloned().unwrap_or_default()}</td> })
                        .collect_view();
                    view! {
                        <tr data-run=row.name.clone()>
                            <td><a href=href>{row.name.clone()}</a>{row.live.then_some(" (live)")}</td>
                            <td class="num">{row.steps}</td>
                            <td class="num">{num(row.loss, 4)}</td>
                            <td class="num">{num(row.eval_loss, 4)}</td>
                            <td class="num">{num(row.eval_accuracy.map(|a| 100.0 * a), 2)}</td>
                            <td class="num">{row.peak_bytes.map(format_bytes).unwrap_or_default()}</td>
                            {cells}
                        </tr>
                    }
                })
                .collect_view();
            view! {
                <table id="hparams-table">
                    <tr><th>"run"</th><th class="num">"steps"</th><th class="num">"loss"</th><th class="num">"eval loss"</th>
                        <th class="num">"eval accuracy %"</th><th class="num">"peak"</th>{head}</tr>
                    {body}
                </table>
            }
            .into_any()
        }
    };
    view! {
        <section class="wide" id="runs-table">
            <h2>"Runs (the config keys that differ between them)"</h2>
            {body}
        </section>
    }
}
