//! `courier erase`: forget a person in every target and in courier itself, or lift the
//! suppression of one who consented again.

use courier::erasure::{self, Person, store};

use super::Ctx;

/// `courier erase`'s arguments: the identities a person may be known by (at least one).
#[derive(clap::Args)]
pub struct EraseArgs {
    /// Their e-mail address.
    #[arg(long)]
    email: Option<String>,
    /// Their phone number (`+48 600 100 200`).
    #[arg(long)]
    phone: Option<String>,
    /// The shop's id of them.
    #[arg(long)]
    external_id: Option<String>,
    /// A record key of theirs (`customer:123`); repeatable.
    #[arg(long = "key")]
    keys: Vec<String>,
    /// Lift the suppression of a person erased before (they consented again): deliveries
    /// naming them go out again. Recorded on each erasure of them.
    #[arg(long)]
    lift: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `courier erase`.
pub async fn erase(ctx: &Ctx, a: EraseArgs) -> anyhow::Result<()> {
    let pool = ctx.pool().await?;
    let person = Person {
        email: a.email,
        phone: a.phone,
        external_id: a.external_id,
        keys: a.keys,
    };
    let by = format!("courier erase ({})", whoami());
    if a.lift {
        let key = ctx.settings.erasure_key.as_ref().ok_or_else(|| {
            anyhow::anyhow!("COURIER_ERASURE_KEY is not set: the erased are found by it")
        })?;
        let lifted = erasure::lift(&pool, key, &person, &by).await?;
        println!("lifted the suppression of erasure(s) {lifted:?}");
        return Ok(());
    }
    let id = erasure::request(&pool, &person, &by).await?;
    let now = chrono::Utc::now();
    let shown = store::erasures(&pool, Some(&[id]), now).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&shown)?);
        return Ok(());
    }
    println!("erasure {id}");
    for part in shown.iter().flat_map(|e| &e.targets) {
        let what = match (part.outcome.as_str(), &part.call) {
            ("pending", Some(call)) => format!("will be told: {call}"),
            (outcome, _) => match &part.error {
                Some(why) => format!("{outcome}: {why}"),
                None => outcome.to_owned(),
            },
        };
        println!("  {:<24} {what}", part.connection);
    }
    if ctx.settings.erasure_key.is_none() {
        println!(
            "note: this shell has no COURIER_ERASURE_KEY; the workers carry the erasure out \
             with theirs"
        );
    }
    Ok(())
}

/// Who runs the command, as the audit records it.
fn whoami() -> String {
    std::env::var("USER").unwrap_or_else(|_| "unknown user".into())
}
