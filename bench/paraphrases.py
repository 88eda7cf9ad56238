"""Facts and questions about them in other words: the recall cases lexical search cannot find.

Each question shares no word (nor a word's stem) with its fact's statement; ``marker`` is a
part of the statement that says the fact was recalled when it reaches the prompt. Written
for bench/recall_hybrid.py, in two sets kept apart (``SETS``):

- ``derive`` (``PARAPHRASES``, ``ABSENT``): where the hybrid defaults were chosen
  (EMBEDDINGS_MIN_SIMILARITY, the chunking, the gate before fusion);
- ``held-out`` (``HELD_OUT``, ``ABSENT_HELD_OUT``): other topics, the same kinds (paraphrases,
  synonyms, "what did we decide about X"), written after those choices and never used to make
  one; the defaults are reported on it as they are.

``ABSENT*`` are questions whose answer no session states (half near the project's topics,
half off them): a recall block for one is noise, which the relevance gate must keep out.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxproxy.memory.words import terms

__all__ = [
    "ABSENT", "ABSENT_HELD_OUT", "HELD_OUT", "PARAPHRASES", "SETS", "Paraphrase", "shared_words",
]


@dataclass(frozen=True)
class Paraphrase:
    statement: str
    question: str
    marker: str


PARAPHRASES: tuple[Paraphrase, ...] = (
    Paraphrase("Let's ship every second Tuesday from now on.",
               "What did we decide about the release cadence?", "every second Tuesday"),
    Paraphrase("Invoices must round half-even to two decimals.",
               "What precision rule applies to monetary totals on bills?", "half-even"),
    Paraphrase("Never push directly to main; everything goes through a pull request.",
               "Am I allowed to commit straight onto the trunk branch?",
               "goes through a pull request"),
    Paraphrase("The staging database gets wiped every Sunday night.",
               "When is the pre-production DB reset?", "wiped every Sunday"),
    Paraphrase("Alice owns the payments service; ask her before changing it.",
               "Who is responsible for the billing microservice?", "Alice owns"),
    Paraphrase("We use pnpm, not npm or yarn, in the frontend repo.",
               "Which JavaScript package manager does the web client rely on?", "pnpm"),
    Paraphrase("Logs older than 30 days are deleted by the retention job.",
               "After how many weeks does old diagnostic output disappear?", "30 days"),
    Paraphrase("Feature flags live in LaunchDarkly under the project checkout-v2.",
               "Where are toggles for gradual rollouts configured?", "LaunchDarkly"),
    Paraphrase("The CI runners have 8 GB of RAM, so keep the suite under 6 GB.",
               "How large can the automated pipeline's memory footprint get?", "8 GB of RAM"),
    Paraphrase("Timestamps are stored in UTC and shown in the user's zone.",
               "Which timezone do we persist dates in?", "stored in UTC"),
    Paraphrase("The mobile app talks to the backend only through the GraphQL gateway.",
               "How do phone clients reach our servers?", "GraphQL gateway"),
    Paraphrase("Our error tracker is Sentry; the DSN is in the vault.",
               "Which tool collects crash reports?", "Sentry"),
    Paraphrase("Code freeze starts on December 15 for the holidays.",
               "When do we stop merging changes before the year-end break?", "December 15"),
    Paraphrase("Use tabs for indentation in the Go code, as gofmt does.",
               "What whitespace style do golang source files follow?", "tabs for indentation"),
    Paraphrase("The cache TTL for product pages is five minutes.",
               "How long do we keep catalogue listings memoised?", "five minutes"),
    Paraphrase("Emails go out through Postmark, never via our own SMTP server.",
               "Which provider delivers our transactional mail?", "Postmark"),
    Paraphrase("Passwords are hashed with argon2id.",
               "Which algorithm protects stored user credentials?", "argon2id"),
    Paraphrase("Bob is on vacation until the 20th; send reviews to Carol.",
               "Who should look at my pull requests this week?", "send reviews to Carol"),
    Paraphrase("Database migrations run automatically on deploy via Alembic.",
               "How are schema changes applied when we release?", "Alembic"),
    Paraphrase("The public API is versioned in the URL path, like /v2/orders.",
               "How do outside clients pick which revision of our endpoints they call?",
               "/v2/orders"),
    Paraphrase("Load tests use k6 and run nightly against staging.",
               "Which tool stresses the system to measure throughput?", "k6 and run nightly"),
    Paraphrase("Images are resized by a Lambda function on upload.",
               "Where does picture thumbnail generation happen?", "Lambda function"),
    Paraphrase("Keep PRs under 400 changed lines so they can be reviewed quickly.",
               "Is there a size limit for code contributions?", "400 changed lines"),
    Paraphrase("Our Kubernetes cluster autoscales between 3 and 12 nodes.",
               "What is the minimum and maximum machine count of the container platform?",
               "between 3 and 12 nodes"),
)


HELD_OUT: tuple[Paraphrase, ...] = (
    Paraphrase("Let's cut a release candidate every Thursday afternoon.",
               "What did we settle on for the pre-launch build cadence?",
               "every Thursday afternoon"),
    Paraphrase("Customer data must never leave the Frankfurt region.",
               "Where are we required to keep client records geographically?",
               "Frankfurt region"),
    Paraphrase("The design system uses Inter as its only typeface.",
               "Which font do our UI components show text in?", "Inter as its only typeface"),
    Paraphrase("Dave handles all on-call escalations for the search cluster.",
               "Whom do I contact when the indexing servers page at night?", "Dave handles"),
    Paraphrase("We decided to drop support for Internet Explorer 11 in March.",
               "Which old browser are we no longer targeting?", "Internet Explorer 11"),
    Paraphrase("API tokens expire after 90 days and must be rotated.",
               "How often do access keys need renewing?", "90 days and must be rotated"),
    Paraphrase("Our analytics warehouse is BigQuery, loaded hourly by Fivetran.",
               "Where do the reporting tables live?", "BigQuery"),
    Paraphrase("Backups are copied to a second cloud account every night at 2am.",
               "When do the disaster recovery snapshots run?", "every night at 2am"),
    Paraphrase("Mobile releases go through TestFlight for one week before the store.",
               "How long is the beta period for the iPhone app?", "TestFlight"),
    Paraphrase("The monorepo is built with Bazel; never call make directly.",
               "Which build tool compiles the big shared repository?", "Bazel"),
    Paraphrase("Support tickets are answered within four business hours.",
               "What response time do we promise people who ask for help?",
               "four business hours"),
    Paraphrase("We chose Redis Streams over Kafka for the event bus.",
               "What did we pick for asynchronous messaging between services?",
               "Redis Streams"),
    Paraphrase("Every new endpoint needs an OpenAPI description before merge.",
               "What documentation is mandatory for a freshly added route?",
               "OpenAPI description"),
    Paraphrase("The marketing site is hosted on Netlify, separate from the app.",
               "Where does the promotional homepage run?", "Netlify"),
    Paraphrase("Ops decided that disk alerts fire at 85 percent usage.",
               "At what fill level do storage warnings trigger?", "85 percent"),
    Paraphrase("Translations are managed in Crowdin by the localisation team.",
               "Which service holds our internationalised strings?", "Crowdin"),
    Paraphrase("Our SLA promises 99.95 percent uptime per month.",
               "What availability guarantee did we give clients?", "99.95"),
    Paraphrase("Frank is the security champion; run threat models past him.",
               "Who reviews risk assessments for new features?",
               "Frank is the security champion"),
    Paraphrase("Staging deploys are frozen during the quarterly audit week.",
               "When can't we ship to the pre-prod environment?", "quarterly audit week"),
    Paraphrase("We agreed to write all new services in Kotlin.",
               "What language should fresh backends be implemented in?", "Kotlin"),
    Paraphrase("The sampling rate for traces is one percent in production.",
               "How much of the request tracing do we keep?", "one percent in production"),
    Paraphrase("Secrets are injected by Doppler at container start.",
               "How do credentials reach the running pods?", "Doppler"),
    Paraphrase("Pair programming is expected for any change to billing code.",
               "Do invoicing modifications need two people at the keyboard?",
               "Pair programming"),
    Paraphrase("The design review happens on Wednesdays at 11 with Grace.",
               "When is the weekly UI critique meeting?", "Wednesdays at 11"),
    Paraphrase("Dependencies are updated by Renovate, batched every Monday.",
               "What keeps our third-party libraries current?", "Renovate"),
    Paraphrase("Feature work pauses during the first week of each quarter for tech debt.",
               "When do we stop building new things to clean up the codebase?",
               "first week of each quarter"),
    Paraphrase("Uploads larger than 50 MB are rejected by the gateway.",
               "What is the maximum file size users can send us?", "50 MB"),
    Paraphrase("Our onboarding guide lives in Notion under Engineering Handbook.",
               "Where can new hires find their setup instructions?", "Notion"),
)

ABSENT: tuple[str, ...] = (
    "Which CDN serves our static assets?",
    "How do we handle GDPR deletion requests?",
    "What is the naming convention for Terraform modules?",
    "Which dashboard shows the queue depth of the workers?",
    "What font size do we use in slide decks?",
    "How many parking spots does the office have?",
    "When does the hackathon registration close?",
    "What is the budget for team lunches?",
)

ABSENT_HELD_OUT: tuple[str, ...] = (
    "What is our policy on open-source license compliance?",
    "Which load balancer sits in front of the admin panel?",
    "How are database read replicas promoted during an outage?",
    "Who approves access to the production logs?",
    "Who approves vacation requests for contractors?",
    "Which printer does the second floor use?",
    "When is the next company offsite?",
    "What is the dress code for customer visits?",
)

SETS: dict[str, tuple[tuple[Paraphrase, ...], tuple[str, ...]]] = {
    "derive": (PARAPHRASES, ABSENT),
    "held-out": (HELD_OUT, ABSENT_HELD_OUT),
}


def _stems(text: str) -> set[str]:
    return {w[:5] for w in terms(text)}


def shared_words(case: Paraphrase) -> set[str]:
    """The words (by their first five letters) a question shares with its statement."""
    return _stems(case.statement) & _stems(case.question)
