// Types of the OwlLayer widget v1 API: window.OwlLayer and the exports of
// /widget/v1/owllayer-widget.js (docs/widget.md).

export type Risk = "none" | "low" | "high" | "critical";

/** An AITP parameter schema (docs/protocol.md §4). */
export interface ParameterSchema {
  type: "STRING" | "NUMBER" | "BOOLEAN" | "OBJECT" | "ARRAY";
  description?: string;
  enum?: Array<string | number>;
  properties?: Record<string, ParameterSchema>;
  required?: string[];
  items?: ParameterSchema;
}

export interface ToolDefinition {
  name: string;
  description?: string;
  parameters?: ParameterSchema;
  /** high and critical: the visitor approves each call first. */
  risk?: Risk;
  /** The sentence the approval dialog asks, from the call's arguments. */
  approvalMessage?: (args: Record<string, unknown>) => string;
  /** What the approval dialog shows of the call, in the page's own words, instead of its arguments. */
  approvalDetails?: (args: Record<string, unknown>) => ApprovalDetails;
}

/** Text only (never HTML); each part missing is the dialog's own. */
export interface ApprovalDetails {
  /** Instead of the tool's description. */
  summary?: string;
  /** [label, value] rows instead of the arguments, e.g. ["Amount", "$160.20"]. */
  rows?: Array<[string, string | number | boolean]>;
  /** Shown in red above the buttons, e.g. an amount that is not the cart's total. */
  warning?: string;
}

/** Returns the result (JSON) or throws (the error's message goes back to the agent). */
export type ToolHandler = (args: Record<string, any>, call: { callId: string }) => unknown | Promise<unknown>;

export interface StartOptions {
  apiKey: string;
  /** The AITP WebSocket; default: the widget's server at /owllayer. */
  endpoint?: string;
  /** The panel's heading; default: the assistant's name the console set for
   * the key, else "Assistant" (docs/widget.md, appearance). */
  title?: string;
  /** A token the tenant's backend signed for this visitor (docs/protocol.md §3c): their
   * conversations are linked, and a new tab or device shows the last one. */
  visitorToken?: string;
  /** The page's own appearance instead of the key's (not read from the server then). */
  appearance?: Appearance;
}

/** How the widget looks and speaks (docs/widget.md, appearance); a field
 * missing or not as described is the default's. */
export interface Appearance {
  /** The panel's heading, at most 40 characters. */
  name?: string;
  /** The agent's first bubble, shown and never sent, at most 300 characters. */
  greeting?: string;
  /** "#rrggbb". */
  accent?: string;
  position?: "right" | "left";
  language?: Language;
  /** Up to 4, at most 80 characters each. */
  prompts?: string[];
}

export interface ReadyEvent { sessionId: string; resumed: boolean }
export type MessageEvent =
  | { role: "user"; text: string; voice?: true }
  | { role: "assistant"; text: string }
  | { role: "operator"; text: string; operator: string };
/** A listener added while an error is on show hears it at once. */
export interface ErrorEvent { message: string; code?: string }

export interface EventMap {
  ready: ReadyEvent;
  message: MessageEvent;
  open: Record<string, never>;
  close: Record<string, never>;
  error: ErrorEvent;
}

export interface OwlLayerApi {
  readonly version: "1";
  registerTool(tool: ToolDefinition, handler: ToolHandler): OwlLayerApi;
  /** Stops offering a page tool (a view that goes away takes its tools with it). */
  unregisterTool(name: string): OwlLayerApi;
  setContext(context: Record<string, unknown>): OwlLayerApi;
  open(): OwlLayerApi;
  close(): OwlLayerApi;
  /** Sends as if typed (queued until connected); false when refused. */
  send(text: string): boolean;
  on<K extends keyof EventMap>(event: K, listener: (detail: EventMap[K]) => void): OwlLayerApi;
  off<K extends keyof EventMap>(event: K, listener: (detail: EventMap[K]) => void): OwlLayerApi;
  /** Starts the widget without data-api-key on the script tag. */
  start(options: StartOptions): OwlLayerApi;
  /** Look and speak this way from now on, whatever the key's appearance says; the conversation stays. */
  setAppearance(appearance: Appearance): OwlLayerApi;
  /** What this page's connection saw, for support (its shape may grow); null before the widget started. */
  diagnostics(): Diagnostics | null;
}

/** The browser client's own record of its connection, kept current. */
export interface Diagnostics {
  state: string;
  sessionId: string | null;
  /** Frames received and handled, and sent. */
  frames: unknown[];
  sent: unknown[];
  /** Frames received that did not validate, and why. */
  dropped: number;
  droppedReasons: unknown[];
  connects: number;
  [more: string]: unknown;
}

export declare const WIDGET_VERSION: "1";
export declare const registerTool: OwlLayerApi["registerTool"];
export declare const unregisterTool: OwlLayerApi["unregisterTool"];
export declare const setContext: OwlLayerApi["setContext"];
export declare const open: OwlLayerApi["open"];
export declare const close: OwlLayerApi["close"];
export declare const send: OwlLayerApi["send"];
export declare const on: OwlLayerApi["on"];
export declare const off: OwlLayerApi["off"];
export declare const start: OwlLayerApi["start"];
export declare const setAppearance: OwlLayerApi["setAppearance"];
export declare const diagnostics: OwlLayerApi["diagnostics"];
export declare function labelOf(name: string): string;
/** The languages of the widget's own sentences, as a key's appearance chooses. */
export type Language = "en" | "fr";
export declare function valueInWords(value: unknown, language?: Language): string;
declare const api: OwlLayerApi;
export default api;

declare global {
  interface Window { OwlLayer: OwlLayerApi }
}
